"""A stream aggregator as teams write them: a Lambda on the table's stream that sums each
batch's child deltas per parent and ADDs them to the parent's counter (the shape of the
shopping-cart sample's ``db_stream_handler``). It keeps no state, so a redelivered batch is
added twice: the reconciler has to catch that as drift.

    aggregator = Aggregator(dynamodb, table, children="PRODUCT#", parent_sk="TOTAL",
                            counter="quantity", summed="quantity")
    aggregator.handler({"Records": records})
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer

_de = TypeDeserializer()


@dataclass
class Aggregator:
    """ADDs the children's deltas to ``counter`` on (PK, ``parent_sk``), one update a parent."""

    dynamodb: Any
    table: str
    children: str  # the children's sort key prefix
    parent_sk: str
    counter: str
    summed: str | None = None  # None: a count (+1 per insert, -1 per removal)
    updates: int = field(default=0)
    # The key attributes, and which one names the parent: a cart's total is keyed by the
    # line's partition key; a product's total across carts (the sample's own shape, pk/sk)
    # by the line's sort key.
    partition_key: str = "PK"
    sort_key: str = "SK"
    parent_named_by: str = "PK"

    def handler(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        deltas: defaultdict[str, Decimal] = defaultdict(Decimal)
        for record in event["Records"]:
            stream = record["dynamodb"]
            keys = {name: _de.deserialize(value) for name, value in stream["Keys"].items()}
            if not str(keys[self.sort_key]).startswith(self.children):
                continue
            new = self._amount(stream.get("NewImage"))
            old = self._amount(stream.get("OldImage"))
            deltas[keys[self.parent_named_by]] += new - old
        for pk, delta in deltas.items():
            if delta == 0:
                continue
            self.dynamodb.update_item(
                TableName=self.table,
                Key={self.partition_key: {"S": pk}, self.sort_key: {"S": self.parent_sk}},
                UpdateExpression="ADD #counter :delta",
                ExpressionAttributeNames={"#counter": self.counter},
                ExpressionAttributeValues={":delta": {"N": str(delta)}},
            )
            self.updates += 1
        return {"statusCode": 200}

    def _amount(self, image: dict[str, Any] | None) -> Decimal:
        if not image:
            return Decimal(0)
        if self.summed is None:
            return Decimal(1)
        raw = image.get(self.summed)
        return Decimal(0) if raw is None else Decimal(_de.deserialize(raw))
