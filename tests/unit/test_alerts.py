"""Alert publishing against moto: SNS topic -> SQS subscriber, de-duplicated by the store."""

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
from tally.reconciler.alerts import AlertPublisher
from tally.reconciler.audit_store import AuditStore
from tally.reconciler.findings import Finding, Repair

TABLE = "audit"


@dataclass(frozen=True)
class Stack:
    sns: Any
    sqs: Any
    topic_arn: str
    queue_url: str
    store: AuditStore

    def publisher(self, topic_arn: str | None = None) -> AlertPublisher:
        return AlertPublisher(self.sns, topic_arn or self.topic_arn, self.store)

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
        yield Stack(sns, sqs, topic_arn, queue_url, AuditStore(dynamodb, TABLE))


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


def test_a_finding_reaches_subscribers_as_its_body_and_attributes(stack: Stack) -> None:
    finding = drift()
    assert stack.publisher().publish(finding) is True

    [envelope] = stack.received()
    assert json.loads(envelope["Message"]) == finding.body()
    assert envelope["Subject"] == finding.subject()
    attributes = {name: a["Value"] for name, a in envelope["MessageAttributes"].items()}
    assert attributes == {
        "kind": "drift",
        "rule": "likes",
        "severity": "warning",
        "repair": "applied",
    }


def test_the_same_finding_alerts_once(stack: Stack) -> None:
    publisher = stack.publisher()
    assert publisher.publish(drift()) is True
    assert publisher.publish(drift()) is False
    # Another process (a redelivered batch on a fresh container) shares the claim.
    assert stack.publisher().publish(drift()) is False

    assert len(stack.received()) == 1


def test_different_findings_alert_separately(stack: Stack) -> None:
    publisher = stack.publisher()
    assert publisher.publish(drift(7, 5)) is True
    assert publisher.publish(drift(8, 5)) is True

    assert len(stack.received()) == 2


def test_a_failed_publish_releases_the_claim_for_the_retry(stack: Stack) -> None:
    missing = stack.topic_arn.replace("tally-alerts", "no-such-topic")
    with pytest.raises(ClientError):
        stack.publisher(missing).publish(drift())
    assert stack.received() == []

    assert stack.publisher().publish(drift()) is True
    assert len(stack.received()) == 1
