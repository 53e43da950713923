"""The index rules the tests share. The followers rule: an edge keyed by the follower
(``PK = USER#<follower>, SK = FOLLOWS#...``) names its followee in ``GSI1PK`` and is counted
while ``GSI1SK`` starts ``FOLLOWING#``. Tests that need more (a revision, a repair mode)
extend a copy with ``FOLLOWERS | {...}``."""

from __future__ import annotations

from typing import Any

FOLLOWERS: dict[str, Any] = {
    "name": "followers",
    "kind": "count",
    "parent": {"PK": "USER#*", "SK": "PROFILE"},
    "children": {"PK": "USER#*", "SK": "FOLLOWS#*"},
    "counter": "followerCount",
    "through": {
        "index": "GSI1",
        "partition_key": "GSI1PK",
        "sort_key": "GSI1SK",
        "sort_prefix": "FOLLOWING#",
    },
}

# The shopping cart's inverted index: a line's own sort key names its product.
CART_TOTALS: dict[str, Any] = {
    "name": "cart-totals",
    "kind": "sum",
    "parent": {"PK": "SKU#*", "SK": "ALLCARTS"},
    "children": {"PK": "BASKET#*", "SK": "SKU#*"},
    "counter": "cartQuantity",
    "summed": "qty",
    "through": {"index": "Inverted", "partition_key": "SK", "sort_key": "PK"},
}


def gsi(
    name: str, pk: str, sk: str | None = None, projection: str = "KEYS_ONLY", *include: str
) -> dict[str, Any]:
    """A secondary index's create_table spec: keyed by ``pk`` (and ``sk``), projecting
    ``projection`` (with the ``include`` attributes, for INCLUDE)."""
    schema = [{"AttributeName": pk, "KeyType": "HASH"}]
    if sk is not None:
        schema.append({"AttributeName": sk, "KeyType": "RANGE"})
    spec: dict[str, Any] = {"ProjectionType": projection}
    if include:
        spec["NonKeyAttributes"] = list(include)
    return {"IndexName": name, "KeySchema": schema, "Projection": spec}


def followers_and_totals_table(
    name: str, *, keys: tuple[str, str] = ("PK", "SK"), inverted: str = "InvertedIndex"
) -> dict[str, Any]:
    """create_table kwargs of a table keyed by ``keys`` with the followers' GSI1 (keys only)
    and ``inverted``, the base keys swapped projecting ``quantity`` (the product totals'),
    on demand, with a stream of both images."""
    pk, sk = keys
    return {
        "TableName": name,
        "AttributeDefinitions": [
            {"AttributeName": a, "AttributeType": "S"} for a in (pk, sk, "GSI1PK", "GSI1SK")
        ],
        "KeySchema": [
            {"AttributeName": pk, "KeyType": "HASH"},
            {"AttributeName": sk, "KeyType": "RANGE"},
        ],
        "BillingMode": "PAY_PER_REQUEST",
        "GlobalSecondaryIndexes": [
            gsi("GSI1", "GSI1PK", "GSI1SK"),
            gsi(inverted, sk, pk, "INCLUDE", "quantity"),
        ],
        "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    }
