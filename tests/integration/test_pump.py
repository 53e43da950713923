"""The pump plays Lambda's event source mapping on DynamoDB Local's real stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tally.local.dynamodb_local import local_client_kwargs
from tally.local.pump import MappingSettings, Pump
from tally.streams import StreamReader, stream_arn
from tests.utils import serialize


class Handler:
    """A stand-in reconciler that records what it was given and fails on request."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.poison: set[str] = set()  # keys whose presence makes the function raise
        self.report_once: set[str] = set()  # keys reported as failed the first time

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        keys = [r["dynamodb"]["Keys"]["SK"]["S"] for r in event["Records"]]
        self.batches.append(keys)
        if self.poison & set(keys):
            raise RuntimeError("poison record")
        failed = [
            r["dynamodb"]["SequenceNumber"]
            for r in event["Records"]
            if r["dynamodb"]["Keys"]["SK"]["S"] in self.report_once
        ]
        self.report_once -= set(keys)
        return {"batchItemFailures": [{"itemIdentifier": n} for n in failed]}

    def delivered(self) -> list[str]:
        return [key for batch in self.batches for key in batch]


@pytest.fixture
def queues(moto_endpoint: str) -> Iterator[tuple[Any, str, str]]:
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    recheck = sqs.create_queue(QueueName="pump-rechecks")["QueueUrl"]
    failures = sqs.create_queue(QueueName="pump-failures")["QueueUrl"]
    yield sqs, recheck, failures
    for url in (recheck, failures):
        sqs.delete_queue(QueueUrl=url)


def make_pump(
    dynamodb: Any,
    endpoint: str,
    table: str,
    queues: tuple[Any, str, str],
    handler: Handler,
    rechecks: list[dict[str, Any]] | None = None,
    **settings: Any,
) -> Pump:
    streams = boto3.client("dynamodbstreams", **local_client_kwargs(endpoint))
    sqs, recheck, failures = queues
    received = rechecks if rechecks is not None else []

    def recheck_handler(event: dict[str, Any]) -> dict[str, Any]:
        received.extend(event["Records"])
        return {"batchItemFailures": []}

    return Pump(
        StreamReader(streams, stream_arn(dynamodb, table)),
        handler,
        recheck_handler,
        sqs,
        recheck,
        failures,
        MappingSettings(**({"batch_size": 10, "max_retries": 2, "bisect": True} | settings)),
    )


def write(dynamodb: Any, table: str, count: int) -> list[str]:
    keys = [f"ITEM#{n:03d}" for n in range(count)]
    for key in keys:
        dynamodb.put_item(TableName=table, Item=serialize({"PK": "P", "SK": key}))
    return keys


def test_records_arrive_once_in_order_in_batches_of_the_batch_size(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    keys = write(dynamodb, table_name, 25)
    handler = Handler()
    make_pump(dynamodb, dynamodb_endpoint, table_name, queues, handler).until_idle()
    assert handler.delivered() == keys
    assert max(len(batch) for batch in handler.batches) == 10


def test_a_partial_failure_is_retried_from_the_first_failed_record(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    keys = write(dynamodb, table_name, 10)
    handler = Handler()
    handler.report_once = {"ITEM#004"}
    pump = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, handler)
    report = pump.until_idle()
    assert handler.batches == [keys, keys[4:]]
    assert report.retries == 1 and report.sent_to_failure_queue == 0


def test_a_function_error_bisects_and_parks_only_the_poison_record(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    keys = write(dynamodb, table_name, 8)
    handler = Handler()
    handler.poison = {"ITEM#005"}
    report = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, handler).until_idle()
    succeeded = [k for batch in handler.batches if "ITEM#005" not in batch for k in batch]
    assert sorted(succeeded) == [k for k in keys if k != "ITEM#005"]
    assert report.bisections >= 3 and report.sent_to_failure_queue == 1
    sqs, _, failures = queues
    [message] = sqs.receive_message(QueueUrl=failures, MaxNumberOfMessages=10)["Messages"]
    info = json.loads(message["Body"])["DDBStreamBatchInfo"]
    assert info["batchSize"] == 1
    assert info["startSequenceNumber"] == info["endSequenceNumber"]
    assert info["streamArn"] == stream_arn(dynamodb, table_name)
    assert json.loads(message["Body"])["requestContext"]["condition"] == "RetryAttemptsExhausted"


def test_without_bisection_the_whole_batch_is_parked_after_the_retry_limit(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    write(dynamodb, table_name, 4)
    handler = Handler()
    handler.poison = {"ITEM#002"}
    pump = make_pump(
        dynamodb, dynamodb_endpoint, table_name, queues, handler, bisect=False, max_retries=1
    )
    report = pump.until_idle()
    assert len(handler.batches) == 2  # the first try and one retry
    assert report.sent_to_failure_queue == 4


def test_due_rechecks_are_delivered_and_delayed_ones_counted_as_pending(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    sqs, recheck, _ = queues
    sqs.send_message(QueueUrl=recheck, MessageBody='{"due": true}')
    sqs.send_message(QueueUrl=recheck, MessageBody='{"due": false}', DelaySeconds=600)
    received: list[dict[str, Any]] = []
    pump = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, Handler(), received)
    report = pump.until_idle()
    assert [json.loads(r["body"]) for r in received] == [{"due": True}]
    assert report.rechecks == 1 and report.pending_rechecks == 1


def test_a_second_pump_resumes_after_the_first_ones_checkpoint(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    write(dynamodb, table_name, 3)
    first = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, Handler())
    first.until_idle()
    dynamodb.put_item(TableName=table_name, Item=serialize({"PK": "P", "SK": "LATE"}))
    handler = Handler()
    second = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, handler)
    second.reader.resume(first.reader.positions())
    second.until_idle()
    assert handler.delivered() == ["LATE"]
