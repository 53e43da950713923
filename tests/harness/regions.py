"""Two or three emulated Regions of one Global Table, as a test drives them: a client per
Region through its front, the table made in each, the items and stream records each Region
shows, and the hidden stamps read behind the fronts (which no program can see)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import boto3
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from tally.core.streams import StreamReader
from tally.local.dynamodb_local import DynamoDBLocal
from tally.local.replication.emulator import Emulator, Settings
from tally.local.replication.replicator import Lag
from tally.local.replication.wire import WireStamp, stamp_of, tombstones_of

US, EU, AP = "us-east-1", "eu-west-1", "ap-southeast-2"
_names = itertools.count()
_serialize = TypeSerializer().serialize
_deserialize = TypeDeserializer().deserialize


@contextlib.contextmanager
def regional_databases() -> Iterator[dict[str, str]]:
    """A DynamoDB Local per Region (us-east-1, eu-west-1, ap-southeast-2), started at once."""
    locals_ = [DynamoDBLocal() for _ in (US, EU, AP)]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda d: d.start(), locals_))
    try:
        yield {r: d.endpoint for r, d in zip((US, EU, AP), locals_, strict=True)}
    finally:
        for d in locals_:
            d.stop()


def wire(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _serialize(v) for k, v in item.items()}


def plain(image: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deserialize(v) for k, v in image.items()}


def client(service: str, endpoint: str, region: str) -> Any:
    return boto3.client(
        service,  # type: ignore[call-overload]
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


@dataclass
class GlobalTable:
    """One replicated table in every Region of an emulator, and what a test asks of it."""

    emulator: Emulator
    name: str
    clients: dict[str, Any] = field(default_factory=dict)
    readers: dict[str, StreamReader] = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        backends: Mapping[str, str],
        *,
        lag: Lag | None = None,
        link_lags: Mapping[tuple[str, str], Lag] | None = None,
        skew_ms: Mapping[str, float] | None = None,
        consistency: str = "eventual",
        conflict_window_ms: float = 0,
    ) -> GlobalTable:
        name = f"gt-{next(_names)}"
        emulator = Emulator(
            Settings(
                dict(backends),
                [name],
                consistency=consistency,  # type: ignore[arg-type]
                lag=lag,
                link_lags=dict(link_lags or {}),
                skew_ms=dict(skew_ms or {}),
                conflict_window_ms=conflict_window_ms,
            )
        ).start()
        table = cls(emulator, name)
        table.clients = {r: client("dynamodb", emulator.endpoint(r), r) for r in backends}
        made = set()
        for region, dynamodb in table.clients.items():
            if consistency == "strong" and made:
                break  # one database for every Region
            dynamodb.create_table(
                TableName=name,
                KeySchema=[
                    {"AttributeName": "PK", "KeyType": "HASH"},
                    {"AttributeName": "SK", "KeyType": "RANGE"},
                ],
                AttributeDefinitions=[
                    {"AttributeName": "PK", "AttributeType": "S"},
                    {"AttributeName": "SK", "AttributeType": "S"},
                ],
                BillingMode="PAY_PER_REQUEST",
                StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
            )
            made.add(region)
        for region, dynamodb in table.clients.items():
            arn = dynamodb.describe_table(TableName=name)["Table"]["LatestStreamArn"]
            streams = client("dynamodbstreams", emulator.endpoint(region), region)
            table.readers[region] = StreamReader(streams, arn, region)
        return table

    @property
    def regions(self) -> Sequence[str]:
        return list(self.clients)

    def put(self, region: str, item: Mapping[str, Any], **kwargs: Any) -> Any:
        return self.clients[region].put_item(TableName=self.name, Item=wire(item), **kwargs)

    def add(self, region: str, key: Mapping[str, Any], attribute: str, amount: int = 1) -> Any:
        return self.clients[region].update_item(
            TableName=self.name,
            Key=wire(key),
            UpdateExpression="ADD #a :n",
            ExpressionAttributeNames={"#a": attribute},
            ExpressionAttributeValues={":n": {"N": str(amount)}},
            ReturnValues="ALL_NEW",
        )

    def delete(self, region: str, key: Mapping[str, Any]) -> Any:
        return self.clients[region].delete_item(TableName=self.name, Key=wire(key))

    def item(self, region: str, key: Mapping[str, Any]) -> dict[str, Any] | None:
        found = self.clients[region].get_item(
            TableName=self.name, Key=wire(key), ConsistentRead=True
        )
        return plain(found["Item"]) if "Item" in found else None

    def items(self, region: str) -> list[dict[str, Any]]:
        pages = (
            self.clients[region]
            .get_paginator("scan")
            .paginate(TableName=self.name, ConsistentRead=True)
        )
        found = [plain(i) for page in pages for i in page["Items"]]
        return sorted(found, key=lambda i: (i["PK"], i["SK"]))

    def records(self, region: str) -> list[dict[str, Any]]:
        """The records this Region's stream shows since the last call (through its front)."""
        return self.readers[region].drain(idle_polls=1)

    def hidden(self, region: str, key: Mapping[str, Any]) -> WireStamp | None:
        """The stamp the Region holds for an item, read behind its front."""
        found = self.emulator.backends[region].get_item(
            TableName=self.name, Key=wire(key), ConsistentRead=True
        )
        return stamp_of(found["Item"]) if "Item" in found else None

    def tombstone(self, region: str, key: Mapping[str, Any]) -> WireStamp | None:
        """The stamp of the item's deletion the Region holds, read behind its front."""
        found = self.emulator.backends[region].get_item(
            TableName=tombstones_of(self.name), Key=wire(key), ConsistentRead=True
        )
        return stamp_of(found["Item"]) if "Item" in found else None

    def deliver(self, source: str, destination: str, key: Mapping[str, Any]) -> bool:
        return self.emulator.deliver(source, destination, self.name, wire(key)).applied

    def close(self) -> None:
        self.emulator.stop()
