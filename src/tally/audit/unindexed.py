"""Children the index cannot see, for the full audit (docs/audit.md, "Children found through
an index").

A ``through`` rule's children are found through a global secondary index: the stream and the
recount see only the items the index holds. An item keyed as one of the rule's children (its
key matches ``rule.child_pattern``) but without the index's partition key attribute, without
its sort key attribute (when the rule names one), or with either of a type the index key
cannot hold (a number for an S key, an empty string, a map...) is in no index: it counts for
no parent, whatever it says. DynamoDB refuses such a write once the index exists, but items
written before the index was created are left out of it silently. Only the full audit reads
the base table, so only it can tell: each is an ``unindexed`` finding, never repaired.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tally.core.dynamodb import deserialize, serialize
from tally.core.numbers import type_name
from tally.reconciler.findings import Finding, child_finding
from tally.rules import IndexChildren, Key, TableKeys, TallyRule
from tally.rules.key_patterns import checks_pass

# What a global secondary index's key attribute can hold: DynamoDB's scalar key types.
INDEX_KEY_TYPES = frozenset({"S", "N", "B"})
WHY_NOT_REPAIRED = "whether the item is a child, and of which parent, is the application's call"


@dataclass(frozen=True)
class Unindexed:
    """Why the index leaves a child-like item out: the attribute, and the type it holds
    (None: absent)."""

    attribute: str
    held: str | None
    holds: frozenset[str]  # the types the index key takes


def index_key_types(rule: TallyRule, keys: TableKeys) -> dict[str, frozenset[str]]:
    """The types each of the index's key attributes takes.

    The index partition key holds a parent's partition key value: the table's partition key
    type. A sort key with a status prefix is a string; without one, any key type.
    """
    through = _through(rule)
    types: dict[str, frozenset[str]] = {through.partition_key: frozenset({keys.partition_key_type})}
    if through.sort_key is not None:
        types[through.sort_key] = (
            frozenset({"S"}) if through.sort_prefix is not None else INDEX_KEY_TYPES
        )
    return types


def child_like(rule: TallyRule, item: Mapping[str, Any], keys: TableKeys) -> bool:
    """Is ``item`` keyed as one of the rule's children (and not as its parent)?"""
    return not checks_pass(_checks(rule.parent_pattern(keys)), item) and checks_pass(
        _checks(rule.child_pattern(keys)), item
    )


def unindexed(rule: TallyRule, item: Mapping[str, Any], keys: TableKeys) -> Unindexed | None:
    """Why the rule's index cannot hold ``item`` (deserialized); None when it holds it.

    Only the index key attributes are read: call it for child-like items.
    """
    for attribute, holds in index_key_types(rule, keys).items():
        if attribute not in item:
            return Unindexed(attribute, None, holds)
        value = item[attribute]
        held = type_name(value)
        if held not in holds or _empty(value):
            return Unindexed(attribute, held, holds)
    return None


def finding(rule: TallyRule, table: str, key: Key, why: Unindexed) -> Finding:
    """The ``unindexed`` finding of one child-like item: by its key, the attribute and the
    type it holds (never the value), never repaired."""
    through = _through(rule)
    holds = " or ".join(sorted(why.holds))
    if why.held is None:
        state = f"{why.attribute} is absent"
    elif why.held in why.holds:
        state = f"{why.attribute} is an empty {why.held}"
    else:
        state = f"{why.attribute} holds {why.held}"
    detail = (
        f"keyed as a child, but index {through.index!r} cannot hold it ({state}; the "
        f"index key takes {holds}): it counts for no parent"
    )
    attribute, held, never = why.attribute, why.held, WHY_NOT_REPAIRED
    return child_finding("unindexed", rule.name, table, key, attribute, held, detail, never)


def read_unindexed(
    client: Any, table: str, rule: TallyRule, key: Key, keys: TableKeys
) -> tuple[Unindexed | None, dict[str, Any]]:
    """The item as a consistent read finds it now (its key and index key attributes only):
    why the index cannot hold it (None: it can, or the item is gone), and the read's
    response (for its consumed capacity)."""
    attributes = [*keys.names, *index_key_types(rule, keys)]
    names = {f"#a{i}": name for i, name in enumerate(dict.fromkeys(attributes))}
    response = client.get_item(
        TableName=table,
        Key=serialize(keys.typed(key)),
        ConsistentRead=True,
        ProjectionExpression=", ".join(names),
        ExpressionAttributeNames=names,
        ReturnConsumedCapacity="TOTAL",
    )
    if "Item" not in response:
        return None, response
    item = deserialize(response["Item"])
    if not child_like(rule, item, keys):
        return None, response
    return unindexed(rule, item, keys), response


def _empty(value: Any) -> bool:
    """An empty string or binary: no index key may be empty."""
    if isinstance(value, str | bytes | bytearray):
        return not value
    inner = getattr(value, "value", None)  # boto3's Binary
    return isinstance(inner, bytes | bytearray) and not inner


def _through(rule: TallyRule) -> IndexChildren:
    if rule.through is None:
        raise ValueError(f"rule {rule.name!r} has no 'through': its children are not indexed")
    return rule.through


def _checks(pattern: Mapping[str, Any]) -> Any:
    return tuple(p.check(name) for name, p in pattern.items())
