"""The table built from template.yaml on DynamoDB Local matches the template."""

from __future__ import annotations

import time
from operator import itemgetter
from typing import Any

from tally.local.template import time_to_live_attribute


def _props(template: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = template["Resources"]["Table"]["Properties"]
    return props


def test_table_has_template_keys_and_indexes(
    dynamodb: Any, table_name: str, template: dict[str, Any]
) -> None:
    props = _props(template)
    table = dynamodb.describe_table(TableName=table_name)["Table"]

    assert table["TableStatus"] == "ACTIVE"
    assert table["KeySchema"] == props["KeySchema"]
    key = itemgetter("AttributeName")
    assert sorted(table["AttributeDefinitions"], key=key) == sorted(
        props["AttributeDefinitions"], key=key
    )
    indexes = {i["IndexName"]: i for i in table["GlobalSecondaryIndexes"]}
    assert set(indexes) == {i["IndexName"] for i in props["GlobalSecondaryIndexes"]}
    for expected in props["GlobalSecondaryIndexes"]:
        actual = indexes[expected["IndexName"]]
        assert actual["KeySchema"] == expected["KeySchema"]
        assert actual["Projection"] == expected["Projection"]
    assert table["StreamSpecification"] == {
        "StreamEnabled": True,
        "StreamViewType": props["StreamSpecification"]["StreamViewType"],
    }


def test_stream_delivers_put_as_insert(
    dynamodb: Any, dynamodb_streams: Any, table_name: str
) -> None:
    item = {"PK": {"S": "counter#a"}, "SK": {"S": "meta"}, "value": {"N": "1"}}
    dynamodb.put_item(TableName=table_name, Item=item)

    stream_arn = dynamodb.describe_table(TableName=table_name)["Table"]["LatestStreamArn"]
    shards = dynamodb_streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"]
    iterators = [
        dynamodb_streams.get_shard_iterator(
            StreamArn=stream_arn, ShardId=s["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for s in shards
    ]
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while not records and time.monotonic() < deadline:
        next_iterators = []
        for iterator in iterators:
            page = dynamodb_streams.get_records(ShardIterator=iterator)
            records.extend(page["Records"])
            if page.get("NextShardIterator"):
                next_iterators.append(page["NextShardIterator"])
        iterators = next_iterators
        if not records:
            time.sleep(0.1)

    assert [r["eventName"] for r in records] == ["INSERT"]
    assert records[0]["dynamodb"]["Keys"] == {"PK": item["PK"], "SK": item["SK"]}
    assert records[0]["dynamodb"]["NewImage"] == item


def test_ttl_enabled_on_template_attribute(
    dynamodb: Any, table_name: str, template: dict[str, Any]
) -> None:
    ttl = dynamodb.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]

    assert ttl["TimeToLiveStatus"] == "ENABLED"
    assert ttl["AttributeName"] == time_to_live_attribute(template, "Table") == "expiresAt"
