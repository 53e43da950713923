"""StreamReader against DynamoDB Local's real stream."""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

import pytest

from tally.core.streams import StreamReader, stream_arn
from tally.local.template import create_table

LAMBDA_KEYS = {
    "eventID",
    "eventName",
    "eventVersion",
    "eventSource",
    "awsRegion",
    "dynamodb",
    "eventSourceARN",
}


def key(pk: str, sk: str = "x") -> dict[str, Any]:
    return {"PK": {"S": pk}, "SK": {"S": sk}}


def put(client: Any, table: str, pk: str, **attributes: Any) -> None:
    client.put_item(TableName=table, Item={**key(pk), **attributes})


def pks(records: list[dict[str, Any]]) -> list[str]:
    return [r["dynamodb"]["Keys"]["PK"]["S"] for r in records]


def sequence_numbers(records: list[dict[str, Any]]) -> list[int]:
    return [int(r["dynamodb"]["SequenceNumber"]) for r in records]


@pytest.fixture
def arn(dynamodb: Any, table_name: str) -> str:
    return stream_arn(dynamodb, table_name)


@pytest.fixture
def reader(dynamodb_streams: Any, arn: str) -> StreamReader:
    return StreamReader(dynamodb_streams, arn)


class CountingClient:
    """Wraps the streams client; counts GetRecords calls and can fail one as expired."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.exceptions = client.exceptions
        self.get_records_calls = 0
        self.expire_next = False
        self.iterator_requests: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_shard_iterator(self, **kwargs: Any) -> Any:
        self.iterator_requests.append(kwargs)
        return self._client.get_shard_iterator(**kwargs)

    def get_records(self, **kwargs: Any) -> Any:
        self.get_records_calls += 1
        if self.expire_next:
            self.expire_next = False
            error = {"Error": {"Code": "ExpiredIteratorException", "Message": "expired"}}
            raise self.exceptions.ExpiredIteratorException(error, "GetRecords")
        return self._client.get_records(**kwargs)


def test_records_have_lambda_shape(
    dynamodb: Any, table_name: str, reader: StreamReader, arn: str
) -> None:
    before = time.time()
    put(
        dynamodb,
        table_name,
        "a",
        n={"N": "1"},
        blob={"B": b"\x00\xff"},
        blobs={"BS": [b"x"]},
        nested={"M": {"list": {"L": [{"B": b"y"}, {"S": "z"}]}}},
    )
    dynamodb.update_item(
        TableName=table_name,
        Key=key("a"),
        UpdateExpression="SET n = n + :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
    dynamodb.delete_item(TableName=table_name, Key=key("a"))

    records = reader.drain()

    assert [r["eventName"] for r in records] == ["INSERT", "MODIFY", "REMOVE"]
    assert json.loads(json.dumps(records)) == records
    insert, modify, remove = records
    for record in records:
        assert set(record) == LAMBDA_KEYS
        assert record["eventSource"] == "aws:dynamodb"
        assert record["eventSourceARN"] == arn
        assert record["awsRegion"] == "us-east-1"
        stream = record["dynamodb"]
        assert stream["Keys"] == key("a")
        assert stream["StreamViewType"] == "NEW_AND_OLD_IMAGES"
        assert isinstance(stream["SizeBytes"], int)
        created = stream["ApproximateCreationDateTime"]
        assert isinstance(created, int | float)
        # DynamoDB Local truncates the creation time to the minute.
        assert before - 60 <= created <= time.time() + 1
    assert sequence_numbers(records) == sorted(sequence_numbers(records))
    assert len(set(sequence_numbers(records))) == 3

    assert "OldImage" not in insert["dynamodb"]
    new = insert["dynamodb"]["NewImage"]
    assert new["n"] == {"N": "1"}
    assert new["blob"] == {"B": base64.b64encode(b"\x00\xff").decode()}
    assert new["blobs"] == {"BS": [base64.b64encode(b"x").decode()]}
    assert new["nested"] == {
        "M": {"list": {"L": [{"B": base64.b64encode(b"y").decode()}, {"S": "z"}]}}
    }
    assert modify["dynamodb"]["OldImage"]["n"] == {"N": "1"}
    assert modify["dynamodb"]["NewImage"]["n"] == {"N": "2"}
    assert "NewImage" not in remove["dynamodb"]
    assert remove["dynamodb"]["OldImage"]["n"] == {"N": "2"}


def test_small_limit_returns_every_record_once(
    dynamodb: Any, table_name: str, reader: StreamReader
) -> None:
    written = [f"item-{i}" for i in range(10)]
    for pk in written:
        put(dynamodb, table_name, pk)

    seen: list[dict[str, Any]] = []
    polls = 0
    while len(seen) < len(written) and polls < 20:
        batch = reader.poll(limit=3)
        assert len(batch) <= 3
        seen.extend(batch)
        polls += 1

    assert pks(seen) == written
    assert polls == 4
    assert reader.poll(limit=3) == []


def test_drain_returns_only_new_records(
    dynamodb: Any, table_name: str, reader: StreamReader
) -> None:
    for pk in ("a", "b", "c"):
        put(dynamodb, table_name, pk)
    assert pks(reader.drain()) == ["a", "b", "c"]
    assert reader.drain() == []

    put(dynamodb, table_name, "d")
    assert pks(reader.drain(limit=1)) == ["d"]
    assert reader.poll() == []


def test_rewind_redelivers_from_that_record(
    dynamodb: Any, table_name: str, reader: StreamReader
) -> None:
    for i in range(5):
        put(dynamodb, table_name, f"item-{i}")
    batches = reader.poll_batches()
    assert len(batches) == 1
    shard_id, records = batches[0]
    assert pks(records) == [f"item-{i}" for i in range(5)]
    assert reader.poll() == []

    reader.rewind(shard_id, records[2]["dynamodb"]["SequenceNumber"])

    assert reader.poll_batches() == [(shard_id, records[2:])]
    assert reader.poll() == []


def test_rewind_unknown_shard_fails(reader: StreamReader) -> None:
    with pytest.raises(KeyError, match="shardId-nope"):
        reader.rewind("shardId-nope", "0" * 21)


def test_transaction_writes_all_appear(
    dynamodb: Any, table_name: str, reader: StreamReader
) -> None:
    put(dynamodb, table_name, "parent", count={"N": "0"})
    reader.drain()

    dynamodb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": table_name, "Item": key("parent", "child-1")}},
            {
                "Update": {
                    "TableName": table_name,
                    "Key": key("parent"),
                    "UpdateExpression": "SET #c = #c + :one",
                    "ExpressionAttributeNames": {"#c": "count"},
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                }
            },
        ]
    )

    records = reader.drain()
    by_key = {r["dynamodb"]["Keys"]["SK"]["S"]: r for r in records}
    assert len(records) == 2
    assert by_key["child-1"]["eventName"] == "INSERT"
    assert by_key["x"]["eventName"] == "MODIFY"
    assert by_key["x"]["dynamodb"]["NewImage"]["count"] == {"N": "1"}


def test_expired_iterator_resumes_after_last_record(
    dynamodb: Any, table_name: str, dynamodb_streams: Any, arn: str
) -> None:
    client = CountingClient(dynamodb_streams)
    reader = StreamReader(client, arn)
    for i in range(4):
        put(dynamodb, table_name, f"item-{i}")
    first = reader.poll(limit=2)
    assert pks(first) == ["item-0", "item-1"]

    client.expire_next = True
    rest = reader.drain()

    assert pks(rest) == ["item-2", "item-3"]
    assert client.iterator_requests[-1]["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER"
    assert client.iterator_requests[-1]["SequenceNumber"] == first[-1]["dynamodb"]["SequenceNumber"]


def test_closed_shard_is_read_to_its_end_then_left_alone(
    dynamodb: Any, table_name: str, dynamodb_streams: Any, arn: str
) -> None:
    client = CountingClient(dynamodb_streams)
    reader = StreamReader(client, arn)
    put(dynamodb, table_name, "a")
    assert pks(reader.poll()) == ["a"]
    put(dynamodb, table_name, "b")
    # Disabling the stream closes its shard: the last GetRecords has no NextShardIterator.
    dynamodb.update_table(TableName=table_name, StreamSpecification={"StreamEnabled": False})

    assert pks(reader.drain()) == ["b"]
    calls = client.get_records_calls
    assert reader.poll() == []
    assert client.get_records_calls == calls


def test_limit_must_be_positive(reader: StreamReader) -> None:
    with pytest.raises(ValueError):
        reader.poll(limit=0)


def test_stream_arn_needs_a_stream(dynamodb: Any, table_name: str, arn: str) -> None:
    assert arn == dynamodb.describe_table(TableName=table_name)["Table"]["LatestStreamArn"]
    plain = f"{table_name}-plain"
    dynamodb.create_table(
        TableName=plain,
        AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    try:
        with pytest.raises(ValueError, match="has no stream"):
            stream_arn(dynamodb, plain)
    finally:
        dynamodb.delete_table(TableName=plain)


class FakeStreams:
    """A stream whose shard lineage is scripted: DynamoDB Local only splits every 4 hours."""

    class exceptions:
        class ExpiredIteratorException(Exception):
            pass

    def __init__(self, shards: dict[str, tuple[str | None, list[str]]], page_size: int) -> None:
        # shard id -> (parent id, sequence numbers); every shard is closed.
        self.shards = shards
        self.page_size = page_size

    def describe_stream(self, StreamArn: str, ExclusiveStartShardId: str = "") -> Any:
        ids = list(self.shards)
        start = ids.index(ExclusiveStartShardId) + 1 if ExclusiveStartShardId else 0
        page = ids[start : start + self.page_size]
        description: dict[str, Any] = {
            "Shards": [
                {"ShardId": i, **({"ParentShardId": p} if (p := self.shards[i][0]) else {})}
                for i in page
            ]
        }
        if start + self.page_size < len(ids):
            description["LastEvaluatedShardId"] = page[-1]
        return {"StreamDescription": description}

    def get_shard_iterator(self, ShardId: str, ShardIteratorType: str, **_: Any) -> Any:
        assert ShardIteratorType == "TRIM_HORIZON"
        return {"ShardIterator": f"{ShardId}|0"}

    def get_records(self, ShardIterator: str, Limit: int) -> Any:
        shard_id, offset = ShardIterator.split("|")
        sequence = self.shards[shard_id][1][int(offset) :]
        records = [
            {
                "eventID": s,
                "eventName": "INSERT",
                "eventVersion": "1.1",
                "dynamodb": {"Keys": key(shard_id), "SequenceNumber": s},
            }
            for s in sequence[:Limit]
        ]
        response: dict[str, Any] = {"Records": records}
        if len(sequence) > Limit:
            response["NextShardIterator"] = f"{shard_id}|{int(offset) + Limit}"
        return response


def test_children_wait_until_their_parent_is_drained() -> None:
    # The child is listed first, DescribeStream takes two pages, and the parent's own
    # parent has aged out of the stream.
    streams = FakeStreams(
        {
            "child": ("parent", ["04", "05"]),
            "parent": ("gone", ["01", "02", "03"]),
        },
        page_size=1,
    )
    reader = StreamReader(streams, "arn:fake")

    batches = [batch for _ in range(10) for batch in reader.poll_batches(limit=2)]
    order = [(shard, r["dynamodb"]["SequenceNumber"]) for shard, rs in batches for r in rs]

    assert order == [
        ("parent", "01"),
        ("parent", "02"),
        ("parent", "03"),
        ("child", "04"),
        ("child", "05"),
    ]


def test_an_empty_shard_read_while_another_table_is_written_is_read_later(
    dynamodb: Any, table_name: str, reader: StreamReader, template: dict[str, Any]
) -> None:
    """DynamoDB Local hands back, for an empty shard, an iterator that a record written to
    another table meanwhile makes stale (TrimmedDataAccessException); the reader starts the
    shard again instead of failing, and misses nothing."""
    other = f"tally-test-{uuid.uuid4().hex[:12]}"
    create_table(dynamodb, template, "Table", other)
    try:
        assert reader.poll() == []  # the empty shard's iterator is kept
        for pk in ("x", "y"):
            put(dynamodb, other, pk)
        put(dynamodb, table_name, "a")
        assert pks(reader.drain()) == ["a"]
    finally:
        dynamodb.delete_table(TableName=other)
