"""Replay re-verifies what the on-failure queue points at, from the stream itself."""

from __future__ import annotations

import json

import pytest

from tally.local.stream_trigger import failure_message
from tally.reconciler.replay import replay
from tests.integration.conftest import Stack

POST = {"PK": "POST#a91f", "SK": "META"}


def test_replay_reads_the_failed_range_again_and_verifies_it(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = stack.sqs.create_queue(QueueName=f"failures-{stack.table}")["QueueUrl"]
    monkeypatch.setenv("STREAM_FAILURE_QUEUE_URL", failures)
    stack.put({**POST, "likeTally": 0})
    stack.put({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    records = stack.records()  # never delivered: as if the batch exhausted its retries
    shard = next(iter(stack.reader.positions()))
    message = failure_message(shard, records, stack.reader.stream_arn, 6, "Unhandled")
    stack.sqs.send_message(QueueUrl=failures, MessageBody=json.dumps(message))

    outcome = replay()

    assert outcome == {"messages": 1, "records": len(records), "aged_out": 0, "failed": 0}
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 0, 1)
    assert stack.sqs.receive_message(QueueUrl=failures).get("Messages") is None


def test_a_range_that_aged_out_is_reported_for_the_full_audit(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = stack.sqs.create_queue(QueueName=f"aged-{stack.table}")["QueueUrl"]
    monkeypatch.setenv("STREAM_FAILURE_QUEUE_URL", failures)
    stack.put({**POST, "likeTally": 0})
    records = stack.records()
    gone = "shardId-00000000000000000000-00000000"  # a shard the stream no longer lists
    message = failure_message(gone, records, stack.reader.stream_arn, 6, None)
    stack.sqs.send_message(QueueUrl=failures, MessageBody=json.dumps(message))
    lines: list[str] = []

    outcome = replay(say=lines.append)

    assert outcome["aged_out"] == 1 and outcome["records"] == 0
    assert "tally audit" in lines[0]
