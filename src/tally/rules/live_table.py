"""A live table as adoption sees it: its key schema, stream and indexes, and a sample of items.

``tally rules check`` and ``tally rules suggest`` read a table the team already runs; local
mode compares a table definition with the rules the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tally.core.dynamodb import deserialize
from tally.rules.key_patterns import key_text
from tally.rules.model import IndexMembers, RuleSet, SequenceRule, TableKeys

STREAM_VIEW = "NEW_AND_OLD_IMAGES"


@dataclass(frozen=True)
class TableShape:
    """What DescribeTable (or a CreateTable request) says about a table."""

    name: str
    keys: TableKeys
    stream_view: str | None
    indexes: frozenset[str]

    @classmethod
    def of(cls, table: Mapping[str, Any]) -> TableShape:
        """From a DescribeTable ``Table`` or create_table kwargs (the same field names)."""
        types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
        roles = {k["KeyType"]: k["AttributeName"] for k in table["KeySchema"]}
        pk, sk = roles["HASH"], roles.get("RANGE")
        keys = TableKeys.model_validate(
            {"partition_key": pk, "partition_key_type": types[pk]}
            | ({"sort_key": sk, "sort_key_type": types[sk]} if sk else {})
        )
        stream = table.get("StreamSpecification") or {}
        view = stream.get("StreamViewType") if stream.get("StreamEnabled", True) else None
        indexes = [
            i["IndexName"]
            for kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes")
            for i in table.get(kind, [])
        ]
        return cls(table["TableName"], keys, view, frozenset(indexes))


def describe(client: Any, table_name: str) -> TableShape:
    return TableShape.of(client.describe_table(TableName=table_name)["Table"])


def schema_problems(rules: RuleSet, shape: TableShape) -> list[str]:
    """Where the rules' [table] section, their indexes and the stream disagree with the table."""
    problems = []
    declared, actual = rules.table, shape.keys
    for what, name, theirs in (
        ("partition key", declared.partition_key, actual.partition_key),
        ("sort key", declared.sort_key, actual.sort_key),
    ):
        if _described(declared, name) != _described(actual, theirs):
            problems.append(
                f"[table] {what}: the rules say {_described(declared, name)}, "
                f"table {shape.name} has {_described(actual, theirs)}"
            )
    for rule in rules:
        index = (
            rule.members.index
            if isinstance(rule, SequenceRule) and isinstance(rule.members, IndexMembers)
            else None
        )
        if index is not None and index not in shape.indexes:
            problems.append(
                f"rule {rule.name!r} field 'members.index': table {shape.name} has no "
                f"index {index!r}"
            )
    if shape.stream_view != STREAM_VIEW:
        now = f"view {shape.stream_view}" if shape.stream_view else "no stream"
        problems.append(
            f"table {shape.name} has {now}: the reconciler reads a {STREAM_VIEW} stream"
        )
    return problems


def _described(keys: TableKeys, name: str | None) -> str:
    return "none" if name is None else f"{name!r} ({keys.type_of(name)})"


def sample(client: Any, table_name: str, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` items in scan order: whole item collections, but for the last one."""
    items: list[dict[str, Any]] = []
    request: dict[str, Any] = {"TableName": table_name}
    while len(items) < limit:
        response = client.scan(**request, Limit=limit - len(items))
        items += [deserialize(raw) for raw in response.get("Items", [])]
        if "LastEvaluatedKey" not in response:
            break
        request["ExclusiveStartKey"] = response["LastEvaluatedKey"]
    return items


def collections(items: Sequence[Mapping[str, Any]], keys: TableKeys) -> dict[str, list[Any]]:
    """Sampled items by partition key, in scan order (a partition's items are contiguous)."""
    grouped: dict[str, list[Any]] = {}
    for item in items:
        grouped.setdefault(key_text(item[keys.partition_key]), []).append(item)
    return grouped
