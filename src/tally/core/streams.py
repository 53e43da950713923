"""Read a DynamoDB stream and hand out records as Lambda's event source mapping would.

Locally and in integration tests the reconciler is fed from DynamoDB Local's real stream
(the `dynamodbstreams` API on the same endpoint) instead of Lambda. Records are converted
to the Lambda event shape, and shards are read the way Lambda reads them: each from its
start, in order, and a child only after its parent is drained.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

# GetRecords rejects a larger Limit.
MAX_GET_RECORDS = 1000


def stream_arn(dynamodb_client: Any, table_name: str) -> str:
    """Return the ARN of the table's current stream."""
    table = dynamodb_client.describe_table(TableName=table_name)["Table"]
    arn = table.get("LatestStreamArn")
    if not arn:
        raise ValueError(f"table {table_name!r} has no stream")
    return str(arn)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _attribute(value: Mapping[str, Any]) -> dict[str, Any]:
    """Return one attribute value in DynamoDB JSON, binaries base64-encoded as in Lambda."""
    ((kind, inner),) = value.items()
    if kind == "B":
        return {"B": _b64(inner)}
    if kind == "BS":
        return {"BS": [_b64(item) for item in inner]}
    if kind == "L":
        return {"L": [_attribute(item) for item in inner]}
    if kind == "M":
        return {"M": _image(inner)}
    return {kind: inner}


def _image(image: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _attribute(value) for name, value in image.items()}


def _epoch_seconds(value: Any) -> int | float:
    # Lambda sends a number; boto3 parses it into a datetime.
    seconds: float = value.timestamp()
    return int(seconds) if seconds.is_integer() else seconds


def lambda_record(record: Mapping[str, Any], stream_arn: str, region: str) -> dict[str, Any]:
    """Convert one boto3 GetRecords record into a Lambda DynamoDB event record."""
    stream = record["dynamodb"]
    dynamodb: dict[str, Any] = {}
    if "ApproximateCreationDateTime" in stream:
        dynamodb["ApproximateCreationDateTime"] = _epoch_seconds(
            stream["ApproximateCreationDateTime"]
        )
    for key in ("Keys", "NewImage", "OldImage"):
        if key in stream:
            dynamodb[key] = _image(stream[key])
    for key in ("SequenceNumber", "SizeBytes", "StreamViewType"):
        if key in stream:
            dynamodb[key] = stream[key]
    converted: dict[str, Any] = {
        "eventID": record["eventID"],
        "eventName": record["eventName"],
        "eventVersion": record["eventVersion"],
        "eventSource": "aws:dynamodb",
        "awsRegion": region,
        "dynamodb": dynamodb,
        "eventSourceARN": stream_arn,
    }
    identity = record.get("userIdentity")
    if identity:
        # The Streams API capitalises these keys; Lambda events do not.
        converted["userIdentity"] = {
            "type": identity["Type"],
            "principalId": identity["PrincipalId"],
        }
    return converted


@dataclass
class _Shard:
    shard_id: str
    parent_id: str | None
    # GetShardIterator arguments that resume after the last record handed out.
    start: dict[str, str] = field(default_factory=lambda: {"ShardIteratorType": "TRIM_HORIZON"})
    iterator: str | None = None
    # Closed and read to its end: NextShardIterator came back absent.
    drained: bool = False


class StreamReader:
    """Poll every shard of one DynamoDB stream, returning records in Lambda's shape."""

    def __init__(self, streams_client: Any, stream_arn: str, region: str = "us-east-1") -> None:
        self._client = streams_client
        self.stream_arn = stream_arn
        self.region = region
        self._shards: dict[str, _Shard] = {}

    def poll_batches(self, limit: int = 100) -> list[tuple[str, list[dict[str, Any]]]]:
        """Return up to `limit` new records as (shard id, records) pairs, in stream order."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._discover_shards()
        batches: list[tuple[str, list[dict[str, Any]]]] = []
        remaining = limit
        # In DescribeStream's order, oldest first: a parent drained early in this loop
        # frees its children within the same poll.
        for shard in self._shards.values():
            if remaining == 0:
                break
            if not self._readable(shard):
                continue
            try:
                records = self._read(shard, min(remaining, MAX_GET_RECORDS))
            except (BotoCoreError, ClientError):
                if batches:  # hand out what was read; this shard is read again next poll
                    break
                raise
            if records:
                batches.append((shard.shard_id, records))
                remaining -= len(records)
        return batches

    def poll(self, limit: int = 100) -> list[dict[str, Any]]:
        """Return up to `limit` new records, in stream order."""
        return [record for _, records in self.poll_batches(limit) for record in records]

    def drain(
        self, limit: int = 100, idle_polls: int = 2, max_polls: int = 200
    ) -> list[dict[str, Any]]:
        """Poll until `idle_polls` polls in a row return nothing, or `max_polls` polls.

        Reaching `max_polls` (writes still arriving) returns what was read so far.
        """
        records: list[dict[str, Any]] = []
        idle = 0
        for _ in range(max_polls):
            batch = self.poll(limit)
            records.extend(batch)
            idle = 0 if batch else idle + 1
            if idle >= idle_polls:
                break
        return records

    def rewind(self, shard_id: str, sequence_number: str) -> None:
        """Make the next poll read `shard_id` again from the record `sequence_number` on.

        Its children, if already started, wait until it is drained again.
        """
        try:
            shard = self._shards[shard_id]
        except KeyError:
            raise KeyError(f"shard {shard_id!r} has not been read") from None
        shard.start = {"ShardIteratorType": "AT_SEQUENCE_NUMBER", "SequenceNumber": sequence_number}
        shard.iterator = None
        shard.drained = False

    def positions(self) -> dict[str, str]:
        """Per shard, the sequence number of the last record handed out (a checkpoint)."""
        return {
            shard.shard_id: shard.start["SequenceNumber"]
            for shard in self._shards.values()
            if shard.start["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER"
        }

    def resume(self, positions: Mapping[str, str]) -> None:
        """Continue after a checkpoint; shards it does not name start from their beginning."""
        self._discover_shards()
        for shard_id, sequence_number in positions.items():
            shard = self._shards.get(shard_id)
            if shard is not None:  # a shard gone from the stream has aged out: skip it
                shard.start = {
                    "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                    "SequenceNumber": sequence_number,
                }
                shard.iterator = None

    def _discover_shards(self) -> None:
        kwargs: dict[str, str] = {"StreamArn": self.stream_arn}
        while True:
            description = self._client.describe_stream(**kwargs)["StreamDescription"]
            for shard in description["Shards"]:
                shard_id = shard["ShardId"]
                if shard_id not in self._shards:
                    self._shards[shard_id] = _Shard(shard_id, shard.get("ParentShardId"))
            last = description.get("LastEvaluatedShardId")
            if not last:
                return
            kwargs["ExclusiveStartShardId"] = last

    def _readable(self, shard: _Shard) -> bool:
        if shard.drained:
            return False
        # A parent never listed had aged out of the stream before this reader started.
        parent = self._shards.get(shard.parent_id) if shard.parent_id else None
        return parent is None or parent.drained

    def _new_iterator(self, shard: _Shard) -> str:
        response = self._client.get_shard_iterator(
            StreamArn=self.stream_arn, ShardId=shard.shard_id, **shard.start
        )
        iterator: str = response["ShardIterator"]
        return iterator

    def _read(self, shard: _Shard, limit: int) -> list[dict[str, Any]]:
        if shard.iterator is None:
            shard.iterator = self._new_iterator(shard)
        try:
            response = self._client.get_records(ShardIterator=shard.iterator, Limit=limit)
        except self._client.exceptions.ExpiredIteratorException:
            shard.iterator = self._new_iterator(shard)
            response = self._client.get_records(ShardIterator=shard.iterator, Limit=limit)
        except ClientError as error:
            # DynamoDB Local: the iterator an empty shard handed back points past a position
            # other tables' records have used since; a new one from the same start is good.
            if error.response.get("Error", {}).get("Code") != "TrimmedDataAccessException":
                raise
            shard.iterator = self._new_iterator(shard)
            response = self._client.get_records(ShardIterator=shard.iterator, Limit=limit)
        records = response["Records"]
        if records:
            shard.start = {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "SequenceNumber": records[-1]["dynamodb"]["SequenceNumber"],
            }
        shard.iterator = response.get("NextShardIterator")
        shard.drained = shard.iterator is None
        return [lambda_record(record, self.stream_arn, self.region) for record in records]
