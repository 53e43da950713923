"""The harness's lagging index (tests/harness/index_lag.py) on DynamoDB Local: through the
hooked client, a Query of an index reads the table as it was a lag earlier; everything
else, and every other client, reads the table as it is. The clock is the test's."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tally.core.streams import StreamReader, stream_arn
from tally.local.dynamodb_local import local_client_kwargs
from tally.local.template import create_table_from
from tests.harness.index_lag import LaggingIndex, StreamTap
from tests.harness.live_index import index_table_kwargs
from tests.utils import deserialize, serialize

LAG, JITTER = 1.5, 0.3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lagging(
    dynamodb: Any, dynamodb_streams: Any, dynamodb_endpoint: str
) -> Iterator[tuple[LaggingIndex, StreamTap, Any, Clock]]:
    table = f"tally-lag-{uuid.uuid4().hex[:10]}"
    create_table_from(dynamodb, index_table_kwargs(table), None)
    clock = Clock()
    index = LaggingIndex(dynamodb, table, lag=LAG, jitter=JITTER, seed=3, clock=clock)
    tap = StreamTap(
        StreamReader(dynamodb_streams, stream_arn(dynamodb, table)), [index.observe], clock=clock
    )
    reader = boto3.client("dynamodb", **local_client_kwargs(dynamodb_endpoint))
    index.install(reader)
    try:
        yield index, tap, reader, clock
    finally:
        index.close()
        with contextlib.suppress(dynamodb.exceptions.ResourceNotFoundException):
            dynamodb.delete_table(TableName=table)


def edge(follower: str, followee: str, status: str = "FOLLOWING#1") -> dict[str, Any]:
    return {"pk": follower, "sk": "FOLLOWS#0", "GSI1PK": followee, "GSI1SK": status}


def followers(client: Any, table: str, followee: str, **extra: Any) -> dict[str, Any]:
    return client.query(  # type: ignore[no-any-return]
        TableName=table,
        IndexName="GSI1",
        KeyConditionExpression="GSI1PK = :f AND begins_with(GSI1SK, :s)",
        ExpressionAttributeValues=serialize({":f": followee, ":s": "FOLLOWING#"}),
        **extra,
    )


def names(answer: dict[str, Any]) -> list[str]:
    return sorted(deserialize(i)["pk"] for i in answer["Items"])


def test_an_index_query_sees_the_table_a_lag_ago_and_nothing_else_does(
    lagging: tuple[LaggingIndex, StreamTap, Any, Clock], dynamodb: Any
) -> None:
    index, tap, reader, clock = lagging
    table = index.table
    dynamodb.put_item(TableName=table, Item=serialize(edge("USER#ann", "USER#x")))
    tap.drain()
    index.catch_up()
    assert names(followers(reader, table, "USER#x")) == ["USER#ann"]

    # bob follows x; ann's edge is re-pointed to y; cy's edge to y is blocked.
    dynamodb.put_item(TableName=table, Item=serialize(edge("USER#bob", "USER#x")))
    dynamodb.put_item(TableName=table, Item=serialize(edge("USER#ann", "USER#y")))
    dynamodb.put_item(TableName=table, Item=serialize(edge("USER#cy", "USER#y")))
    tap.drain()
    clock.now += LAG + JITTER
    index.apply_due()
    dynamodb.put_item(TableName=table, Item=serialize(edge("USER#cy", "USER#y", "BLOCKED#2")))
    tap.drain()
    clock.now += LAG - JITTER - 0.01  # not yet a lag since cy's block was seen
    assert index.apply_due() == 0
    answer = followers(reader, table, "USER#y")
    assert names(answer) == ["USER#ann", "USER#cy"]  # cy still FOLLOWING in the index
    assert (answer["Count"], answer["ScannedCount"]) == (2, 2)

    # A fresh change: hidden from the index, and a left parent still shows the edge.
    dynamodb.delete_item(TableName=table, Key=serialize({"pk": "USER#bob", "sk": "FOLLOWS#0"}))
    dynamodb.put_item(TableName=table, Item=serialize(edge("USER#dee", "USER#x")))
    tap.drain()
    index.apply_due()
    lagging_answer = followers(reader, table, "USER#x")
    assert names(lagging_answer) == ["USER#bob"]
    assert (lagging_answer["Count"], lagging_answer["ScannedCount"]) == (1, 1)
    # Any other client, and the base table through the hooked one, see the table now.
    assert names(followers(dynamodb, table, "USER#x")) == ["USER#dee"]
    base = reader.get_item(
        TableName=table, Key=serialize({"pk": "USER#bob", "sk": "FOLLOWS#0"}), ConsistentRead=True
    )
    assert "Item" not in base
    scanned = reader.query(
        TableName=table,
        KeyConditionExpression="pk = :p",
        ExpressionAttributeValues=serialize({":p": "USER#cy"}),
        ConsistentRead=True,
    )
    assert deserialize(scanned["Items"][0])["GSI1SK"] == "BLOCKED#2"

    clock.now += LAG + JITTER
    index.apply_due()
    assert names(followers(reader, table, "USER#x")) == ["USER#dee"]
    assert names(followers(reader, table, "USER#y")) == ["USER#ann"]
    assert index.schedule.pending == 0


def test_pages_capacity_and_projection_are_the_index_own(
    lagging: tuple[LaggingIndex, StreamTap, Any, Clock], dynamodb: Any
) -> None:
    index, tap, reader, clock = lagging
    table = index.table
    for n in range(5):
        dynamodb.put_item(
            TableName=table, Item=serialize(edge(f"USER#f{n}", "USER#x") | {"pad": "p"})
        )
    tap.drain()
    clock.now += LAG + JITTER
    index.apply_due()
    dynamodb.put_item(TableName=table, Item=serialize(edge("USER#late", "USER#x")))
    tap.drain()
    pages = reader.get_paginator("query").paginate(
        TableName=table,
        IndexName="GSI1",
        KeyConditionExpression="GSI1PK = :f",
        ExpressionAttributeValues=serialize({":f": "USER#x"}),
        ReturnConsumedCapacity="TOTAL",
        PaginationConfig={"PageSize": 2},
    )
    seen = [deserialize(i) for page in pages for i in page["Items"]]
    assert sorted(i["pk"] for i in seen) == [f"USER#f{n}" for n in range(5)]
    assert all("pad" not in i for i in seen)  # GSI1 projects keys only
    assert index.redirected >= 3
    counted = reader.query(
        TableName=table,
        IndexName="GSI1",
        KeyConditionExpression="GSI1PK = :f",
        ExpressionAttributeValues=serialize({":f": "USER#x"}),
        Select="COUNT",
        ReturnConsumedCapacity="TOTAL",
    )
    assert counted["Count"] == 5 and counted["ConsumedCapacity"]["CapacityUnits"] > 0
