"""Alert publishing against moto: outbox -> SNS topic -> SQS subscriber."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from tally.local.template import create_table, load_template, template_path
from tally.reconciler.findings import AlertMessage, Finding, Repair
from tally.reconciler.report.alerts import AlertPublisher
from tally.reconciler.store.outbox import LEASE_SECONDS
from tally.reconciler.store.parts import Store

TABLE = "audit"


@dataclass(frozen=True)
class Stack:
    sns: Any
    sqs: Any
    topic_arn: str
    queue_url: str
    store: Store

    def publisher(self, topic_arn: str | None = None) -> AlertPublisher:
        return AlertPublisher(self.sns, topic_arn or self.topic_arn, self.store.outbox)

    def received(self) -> list[dict[str, Any]]:
        """Every SNS envelope the subscribed queue holds, drained."""
        envelopes: list[dict[str, Any]] = []
        while True:
            response = self.sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            )
            messages = response.get("Messages", [])
            if not messages:
                return envelopes
            for message in messages:
                envelopes.append(json.loads(message["Body"]))
                self.sqs.delete_message(
                    QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
                )


@pytest.fixture
def stack() -> Iterator[Stack]:
    with mock_aws():
        dynamodb = boto3.client("dynamodb")
        create_table(dynamodb, load_template(template_path()), "AuditTable", TABLE)
        sns, sqs = boto3.client("sns"), boto3.client("sqs")
        topic_arn = sns.create_topic(Name="tally-alerts")["TopicArn"]
        queue_url = sqs.create_queue(QueueName="alerts-subscriber")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
        yield Stack(sns, sqs, topic_arn, queue_url, Store(dynamodb, TABLE))


def drift(stored: int = 7, actual: int = 5) -> Finding:
    return Finding(
        kind="drift",
        rule="likes",
        table="t",
        key={"PK": "POST#a91f", "SK": "META"},
        attribute="likeTally",
        stored=Decimal(stored),
        actual=Decimal(actual),
        repair=Repair("applied", "counter set to the settled recount", Decimal(7), Decimal(5)),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def queued(stack: Stack, finding: Finding, occurrence: str = "1") -> AlertMessage:
    """The finding's alert written to the outbox, as a repair's transaction writes it."""
    message = AlertMessage.of(finding, finding.alert_id(occurrence))
    assert stack.store.outbox.enqueue([stack.store.outbox.outbox_put(message)])
    return message


def test_a_finding_reaches_subscribers_as_its_body_and_attributes(stack: Stack) -> None:
    finding = drift()
    message = queued(stack, finding)
    stack.publisher().send(message)

    [envelope] = stack.received()
    assert json.loads(envelope["Message"]) == finding.body(message.alert_id)
    assert json.loads(envelope["Message"])["alert_id"] == message.alert_id
    assert envelope["Subject"] == finding.subject()
    attributes = {name: a["Value"] for name, a in envelope["MessageAttributes"].items()}
    assert attributes == {
        "kind": "drift",
        "rule": "likes",
        "severity": "warning",
        "repair": "applied",
    }
    assert stack.store.outbox.pending_alerts() == []


def test_a_failed_publish_stays_pending_and_the_next_flush_sends_it(stack: Stack) -> None:
    message = queued(stack, drift())
    missing = stack.topic_arn.replace("tally-alerts", "no-such-topic")
    with pytest.raises(ClientError):
        stack.publisher(missing).send(message)
    assert stack.received() == []

    assert stack.publisher().flush() == (1, [])  # the lease was given back: no wait
    [envelope] = stack.received()
    assert json.loads(envelope["Message"])["alert_id"] == message.alert_id
    assert stack.publisher().flush() == (0, [])


def test_an_alert_that_cannot_be_sent_never_holds_back_the_others(stack: Stack) -> None:
    broken = AlertMessage("a0", "subject", "{}", {"kind": {"DataType": "Nope", "StringValue": ""}})
    assert stack.store.outbox.enqueue([stack.store.outbox.outbox_put(broken)])
    stack.store.outbox.release_alert("a0")
    queued(stack, drift(9, 5), "2")
    stack.store.outbox.release_alert(drift(9, 5).alert_id("2"))
    sent, errors = stack.publisher().flush()
    assert sent == 1 and len(errors) == 1 and "a0" in errors[0]
    assert len(stack.received()) == 1


def test_a_subject_is_printable_ascii_whatever_the_key_holds() -> None:
    finding = Finding(
        kind="drift",
        rule="likes",
        table="t",
        key={"PK": "POST#x\n\u00e9", "SK": "META"},
        attribute="likeTally",
        stored=Decimal(1),
        actual=Decimal(0),
    )
    assert all(" " <= c <= "~" for c in finding.subject())


def test_a_flush_leaves_alerts_whose_writer_still_holds_the_lease(stack: Stack) -> None:
    clock = Clock()
    store = Store(stack.store.client, TABLE, clock)
    message = AlertMessage.of(drift(), "a1")
    assert store.outbox.enqueue([store.outbox.outbox_put(message)])
    publisher = AlertPublisher(stack.sns, stack.topic_arn, store.outbox)
    assert publisher.flush() == (0, [])
    clock.now += LEASE_SECONDS + 1  # its writer died before publishing
    assert publisher.flush() == (1, [])
    assert len(stack.received()) == 1
