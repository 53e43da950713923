"""Replay: re-verify the stream batches that exhausted their retries.

Lambda's on-failure destination receives a pointer, not the records: the shard and the
sequence range. Replay reads that range from the stream again (within its 24-hour
retention) and verifies it as the stream handler would. A range that has aged out of the
stream can only be covered by the full audit, and replay says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tally.core.aws import client
from tally.core.settings import settings
from tally.core.streams import lambda_record
from tally.reconciler import runtime


def replay(say: Callable[[str], None] = lambda _: None) -> dict[str, int]:
    """Replay every message on the on-failure queue; delete the ones verified."""
    queue = settings().require("stream_failure_queue_url")
    sqs, streams = client("sqs"), client("dynamodbstreams")
    # Later batches may have carried past these records: each group is recounted instead.
    reconciler = runtime.reconciler(carrying=False)
    outcome = {"messages": 0, "records": 0, "aged_out": 0, "failed": 0}
    for message in _messages(sqs, queue):
        outcome["messages"] += 1
        info = json.loads(message["Body"])["DDBStreamBatchInfo"]
        records = list(_records(streams, info))
        if not records:
            outcome["aged_out"] += 1
            start = f"{info['shardId']} {info['startSequenceNumber']}"
            say(f"replay: {start}.. aged out of the stream: run `tally audit`")
        elif reconciler.verify_batch(records):
            outcome["failed"] += 1
            say(f"replay: {info['shardId']} {info['startSequenceNumber']}.. failed again, kept")
            continue
        outcome["records"] += len(records)
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    return outcome


def _messages(sqs: Any, queue: str) -> Iterator[dict[str, Any]]:
    while True:
        batch = sqs.receive_message(
            QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=300
        ).get("Messages", [])
        if not batch:
            return
        yield from batch


def _records(streams: Any, info: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The records of one failed batch, from the stream, in Lambda's shape."""
    arn, end = info["streamArn"], int(info["endSequenceNumber"])
    try:
        iterator = streams.get_shard_iterator(
            StreamArn=arn,
            ShardId=info["shardId"],
            ShardIteratorType="AT_SEQUENCE_NUMBER",
            SequenceNumber=info["startSequenceNumber"],
        )["ShardIterator"]
    except (
        streams.exceptions.TrimmedDataAccessException,
        streams.exceptions.ResourceNotFoundException,
    ):
        return
    while iterator:
        response = streams.get_records(ShardIterator=iterator, Limit=1000)
        for record in response["Records"]:
            if int(record["dynamodb"]["SequenceNumber"]) > end:
                return
            yield lambda_record(record, arn, record.get("awsRegion", "us-east-1"))
        if not response["Records"]:
            return
        iterator = response.get("NextShardIterator")
