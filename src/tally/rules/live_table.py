"""A live table as adoption sees it: its key schema, stream and indexes, and a sample of items.

``tally rules check`` and ``tally rules suggest`` read a table the team already runs; local
mode compares a table definition with the rules the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tally.core.dynamodb import deserialize
from tally.rules.key_patterns import key_text
from tally.rules.rule_set import AnyRule, RuleSet
from tally.rules.sequence_rules import IndexMembers, SequenceRule
from tally.rules.table_keys import TableKeys
from tally.rules.tally_rules import SumRule, TallyRule

STREAM_VIEW = "NEW_AND_OLD_IMAGES"


@dataclass(frozen=True)
class IndexShape:
    """One secondary index: its keys (with their attribute types) and what it projects."""

    name: str
    partition_key: str
    sort_key: str | None
    projection: str  # ALL | KEYS_ONLY | INCLUDE
    non_key_attributes: frozenset[str] = frozenset()
    is_global: bool = True
    partition_key_type: str = "S"
    sort_key_type: str | None = None

    @classmethod
    def of(
        cls, index: Mapping[str, Any], types: Mapping[str, str], *, is_global: bool
    ) -> IndexShape:
        roles = {k["KeyType"]: k["AttributeName"] for k in index["KeySchema"]}
        projection = index.get("Projection") or {}
        pk, sk = roles["HASH"], roles.get("RANGE")
        return cls(
            name=index["IndexName"],
            partition_key=pk,
            sort_key=sk,
            projection=projection.get("ProjectionType", "ALL"),
            non_key_attributes=frozenset(projection.get("NonKeyAttributes", ())),
            is_global=is_global,
            partition_key_type=types.get(pk, "S"),
            sort_key_type=None if sk is None else types.get(sk, "S"),
        )

    def projects(self, attribute: str, table_keys: Sequence[str]) -> bool:
        """Whether a Query on this index returns ``attribute`` (keys are always projected)."""
        if attribute in (self.partition_key, self.sort_key, *table_keys):
            return True
        return self.projection == "ALL" or (
            self.projection == "INCLUDE" and attribute in self.non_key_attributes
        )


@dataclass(frozen=True)
class TableShape:
    """What DescribeTable (or a CreateTable request) says about a table.

    ``indexes`` names every secondary index; ``index_shapes`` describes those the table's
    description gave (a shape built by hand may name indexes without them).
    """

    name: str
    keys: TableKeys
    stream_view: str | None
    indexes: frozenset[str]
    index_shapes: tuple[IndexShape, ...] = ()

    def index(self, name: str) -> IndexShape | None:
        return next((i for i in self.index_shapes if i.name == name), None)

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
        indexes = tuple(
            IndexShape.of(i, types, is_global=kind == "GlobalSecondaryIndexes")
            for kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes")
            for i in table.get(kind, [])
        )
        return cls(table["TableName"], keys, view, frozenset(i.name for i in indexes), indexes)


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
        problems += [
            f"rule {rule.name!r} field 'through.{field}': {problem}"
            for field, problem in _through_problems(rule, shape)
        ]
    if shape.stream_view != STREAM_VIEW:
        now = f"view {shape.stream_view}" if shape.stream_view else "no stream"
        problems.append(
            f"table {shape.name} has {now}: the reconciler reads a {STREAM_VIEW} stream"
        )
    return problems


def _through_problems(rule: AnyRule, shape: TableShape) -> Iterator[tuple[str, str]]:
    """Why the index a ``through`` rule reads cannot give it its children, by field."""
    if not isinstance(rule, TallyRule) or rule.through is None:
        return
    through, table = rule.through, shape.name
    if through.index not in shape.indexes:
        yield "index", f"table {table} has no index {through.index!r}"
        return
    index = shape.index(through.index)
    if index is None:
        return  # named without a description: nothing more to compare
    if not index.is_global:
        yield (
            "index",
            (
                f"{through.index!r} of table {table} is a local index: it holds only its own "
                "item collection, children in other collections need a global one"
            ),
        )
        return
    if index.partition_key != through.partition_key:
        yield (
            "partition_key",
            (
                f"index {through.index!r} of table {table} has the partition key "
                f"{index.partition_key!r}, not {through.partition_key!r}"
            ),
        )
    elif index.partition_key_type != shape.keys.partition_key_type:
        yield (
            "partition_key",
            (
                f"index {through.index!r} of table {table} keys {index.partition_key!r} as "
                f"{index.partition_key_type}: it holds the parent's partition key, "
                f"{shape.keys.partition_key_type}"
            ),
        )
    if through.sort_key is not None and index.sort_key != through.sort_key:
        theirs = "no sort key" if index.sort_key is None else f"the sort key {index.sort_key!r}"
        yield (
            "sort_key",
            (f"index {through.index!r} of table {table} has {theirs}, not {through.sort_key!r}"),
        )
    elif through.sort_prefix is not None and index.sort_key_type != "S":
        yield (
            "sort_prefix",
            (
                f"index {through.index!r} of table {table} keys {index.sort_key!r} as "
                f"{index.sort_key_type}: a prefix needs a string sort key"
            ),
        )
    if isinstance(rule, SumRule) and not index.projects(rule.summed, shape.keys.names):
        listed = (
            f" (it includes {', '.join(sorted(index.non_key_attributes))})"
            if index.non_key_attributes
            else ""
        )
        yield (
            "index",
            (
                f"index {through.index!r} of table {table} projects {index.projection}{listed}: "
                f"it must project {rule.summed!r} (ALL, or INCLUDE listing it)"
            ),
        )


def _described(keys: TableKeys, name: str | None) -> str:
    return "none" if name is None else f"{name!r} ({keys.type_of(name)})"


def sample(client: Any, table_name: str, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` items in scan order: whole item collections, but for the last one."""
    items: list[dict[str, Any]] = []
    request: dict[str, Any] = {"TableName": table_name}
    # By hand, not a paginator: each request's Limit is the items still missing, so the
    # scan reads (and is billed for) no item past the sample; a paginator asks every page
    # for the same Limit and drops the surplus.
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
