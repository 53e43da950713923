"""A repair writes only over a number it has read and judged: never over a user's text.

A counter attribute holding text (an e-mail address in ``likeTally``) is alerted as
``invalid_counter`` on every path that judges it, and the value stays, byte for byte.
"""

from __future__ import annotations

import json

import pytest

from tally.audit.full_audit import full_audit
from tally.local.stream_trigger import failure_message
from tally.reconciler import runtime
from tally.reconciler.replay import replay
from tally.reconciler.report.rechecks import Recheck, RecheckQueue
from tally.rules import load_rules
from tally.writers import SequenceAllocator, TallyWriter
from tests.integration.conftest import RULES_FILE, Stack

RULES = load_rules(RULES_FILE)
POST = {"PK": "POST#a91f", "SK": "META"}
PROJECT = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
ADDRESS = "someone@example.com"


def post_with_likes(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    writer = TallyWriter(stack.dynamodb, stack.table, RULES)
    for user in range(3):
        writer.add_child({"PK": "POST#a91f", "SK": f"LIKE#USER#{user}"})
    stack.settle()
    assert stack.alerts() == []


def text_counter(stack: Stack) -> None:
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key={"PK": {"S": "POST#a91f"}, "SK": {"S": "META"}},
        UpdateExpression="SET likeTally = :text",
        ExpressionAttributeValues={":text": {"S": ADDRESS}},
    )


def assert_alerted_and_kept(stack: Stack) -> None:
    [alert] = stack.alerts()
    assert (alert["kind"], alert["repair"]["status"]) == ("invalid_counter", "skipped")
    assert stack.item("POST#a91f", "META")["likeTally"] == ADDRESS  # type: ignore[index]


def test_the_stream_never_repairs_a_text_counter(stack: Stack) -> None:
    post_with_likes(stack)
    text_counter(stack)
    stack.settle()
    assert_alerted_and_kept(stack)


def test_a_recheck_never_repairs_a_text_counter(stack: Stack) -> None:
    post_with_likes(stack)
    text_counter(stack)
    stack.records()  # the stream's records are lost: a recheck (a carry's, a deferral) judges
    RecheckQueue(stack.sqs, stack.recheck_queue).schedule(Recheck("likes", POST, 0, "test"), 0)
    stack.settle()
    assert_alerted_and_kept(stack)


def test_the_full_audit_never_repairs_a_text_counter(stack: Stack) -> None:
    post_with_likes(stack)
    text_counter(stack)
    stack.records()
    full_audit(runtime.reconciler(), rule="likes")
    assert_alerted_and_kept(stack)


def test_a_replay_never_repairs_a_text_counter(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = stack.sqs.create_queue(QueueName=f"failures-{stack.table}")["QueueUrl"]
    monkeypatch.setenv("STREAM_FAILURE_QUEUE_URL", failures)
    post_with_likes(stack)
    text_counter(stack)
    records = stack.records()  # never delivered: as if the batch exhausted its retries
    shard = next(iter(stack.reader.positions()))
    message = failure_message(shard, records, stack.reader.stream_arn, 6, "Unhandled")
    stack.sqs.send_message(QueueUrl=failures, MessageBody=json.dumps(message))
    assert replay()["records"] == len(records)
    assert_alerted_and_kept(stack)


def test_a_sequence_recheck_never_raises_a_text_counter(stack: Stack) -> None:
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(2):
        numbers.allocate(PROJECT)
    stack.settle()
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key={"PK": {"S": "PROJECT#A"}, "SK": {"S": "COUNTER#ISSUE"}},
        UpdateExpression="SET lastIssue = :text",
        ExpressionAttributeValues={":text": {"S": ADDRESS}},
    )
    stack.settle()
    alerts = stack.alerts()
    assert [(a["kind"], a["repair"]["status"]) for a in alerts] == [("invalid_counter", "skipped")]
    counter = stack.item("PROJECT#A", "COUNTER#ISSUE")
    assert counter is not None and counter["lastIssue"] == ADDRESS
