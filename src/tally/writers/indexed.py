"""Children found through an index (count and sum rules with ``through``): the parent a child's
item names, the refusal naming the field when it names none, and the plan of a write that
moves an edge between parents.

Such a child's key does not name its parent: its index key attributes do, in the item as
stored (``rule.indexed_parent``). So a writer derives the parent from the item it writes (add)
or from the item it read (remove, change, move), and fences the write on the index key values
it read: a concurrent re-parent then cancels the write instead of making it count against a
parent the item no longer names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import tally.writers.items as items
from tally.rules import IndexChildren, Key, TableKeys, TallyRule
from tally.writers.errors import Field, InvalidRequestError


def through(rule: TallyRule) -> IndexChildren:
    assert rule.through is not None
    return rule.through


def field_of(name: str, keys: TableKeys, base: Field) -> Field:
    """Where a request carries the attribute: the key for a key attribute (an inverted index
    over the table's own keys), else under ``base``."""
    return ("key", name) if name in keys.names else (*base, name)


def named_parent(rule: TallyRule, item: Mapping[str, Any], keys: TableKeys, base: Field) -> Key:
    """The parent ``item`` names; a refusal naming the index attribute at fault if none."""
    parent = rule.indexed_parent(item, keys)
    if parent is None:
        raise no_parent(rule, item, keys, base)
    field = field_of(through(rule).partition_key, keys, base)
    size = items.utf8_length(parent[keys.partition_key], field)
    if size > items.MAX_PARTITION_KEY_BYTES:
        raise InvalidRequestError(
            field,
            f"names a parent whose {keys.partition_key} is {size} bytes; DynamoDB allows "
            f"at most {items.MAX_PARTITION_KEY_BYTES} in a partition key",
        )
    return parent


def check_index_keys(
    rule: TallyRule, keys: TableKeys, values: Mapping[str, Any], base: Field
) -> None:
    """An index key attribute written is a non-empty string, a number or non-empty bytes (an
    index takes nothing else as a key); None (a move removing it) passes."""
    for name in through(rule).attributes:
        value = values.get(name)
        if value is None or (isinstance(value, Decimal | int) and not isinstance(value, bool)):
            continue
        if isinstance(value, str | bytes | bytearray) and len(value) > 0:
            continue
        raise InvalidRequestError(
            field_of(name, keys, base),
            f"is a key of index {through(rule).index!r}: a non-empty string, a number or "
            "non-empty bytes",
        )


def refused_index_key(
    messages: list[str], rule: TallyRule, written: Mapping[str, Any]
) -> str | None:
    """The index key attribute DynamoDB refused, when its messages say it refused one (a type
    the index does not declare): the one a message names, else the first one written that is
    not a string (the index partition key is the parent's, a string), else the sort key."""
    index = through(rule)
    about_index = [m for m in messages if "index key" in m.lower() or "secondary index" in m]
    if not about_index:
        return None
    for message in about_index:
        for name in index.attributes:
            if re.search(rf"\b{re.escape(name)}\b", message):
                return name
    for name in index.attributes:
        if name in written and not isinstance(written[name], str):
            return name
    return index.sort_key or index.partition_key


def no_parent(
    rule: TallyRule, item: Mapping[str, Any], keys: TableKeys, base: Field
) -> InvalidRequestError:
    """Why ``item`` is no child of ``rule``, on the index attribute at fault."""
    index = through(rule)
    named = item.get(index.partition_key)
    field = field_of(index.partition_key, keys, base)
    what = f"a {rule.name!r} child names its parent in {index.partition_key!r}"
    if named is None:
        return InvalidRequestError(
            field, f"is missing: {what} (the partition key of index {index.index!r})"
        )
    if not isinstance(named, str) or not named:
        return InvalidRequestError(field, f"must be a non-empty string: {what}")
    if index.sort_prefix is not None and index.sort_key is not None:
        status = item.get(index.sort_key)
        if not isinstance(status, str) or not status.startswith(index.sort_prefix):
            return InvalidRequestError(
                field_of(index.sort_key, keys, base),
                f"must be a string starting {index.sort_prefix!r}: only those "
                f"{rule.name!r} children are counted",
            )
    pattern = rule.parent[keys.partition_key]
    return InvalidRequestError(
        field,
        f"names no parent of rule {rule.name!r}: its parents' {keys.partition_key} is {pattern!r}",
    )


def leaves_deliberately(rule: TallyRule, item: Mapping[str, Any]) -> bool:
    """Whether an item that names no parent does so on purpose: no index partition key (it
    left the sparse index) or a status outside the counted prefix. An index partition key
    naming no parent of the rule's, under a counted status (or with no prefix), is a
    mistake, refused."""
    index = through(rule)
    named = item.get(index.partition_key)
    if named is None:
        return True
    if not isinstance(named, str) or not named:
        return False
    if index.sort_prefix is None or index.sort_key is None:
        return False
    status = item.get(index.sort_key)
    return not (isinstance(status, str) and status.startswith(index.sort_prefix))


def index_values(
    rule: TallyRule, keys: TableKeys, values: Mapping[str, Any], base: Field
) -> dict[str, Any]:
    """A move's index key values (None: remove the attribute), checked: only the index's
    key attributes that are not the table's own may move."""
    index = through(rule)
    movable = [name for name in index.attributes if name not in keys.names]
    if not values:
        raise InvalidRequestError(base, f"name the index attributes to set: {movable}")
    checked = items.attributes({k: v for k, v in values.items() if v is not None}, base)
    moves: dict[str, Any] = {}
    for name in values:
        if name in keys.names:
            raise InvalidRequestError(
                (*base, name),
                "is a key attribute: a child's key never changes (remove it and add another)",
            )
        if name not in index.attributes:
            raise InvalidRequestError(
                (*base, name),
                f"is not a key of index {index.index!r}: a move sets only {movable}",
            )
        moves[name] = checked.get(name)
    check_index_keys(rule, keys, moves, base)
    return moves


def moves(
    old_parent: Key | None, new_parent: Key | None, amount: Decimal
) -> list[tuple[Key, Decimal]]:
    """The counter updates of an edge moving from ``old_parent`` to ``new_parent`` (None: not
    a child on that side): -amount on the old one, +amount on the new one, none if equal."""
    if old_parent == new_parent:
        return []
    updates: list[tuple[Key, Decimal]] = []
    if old_parent is not None:
        updates.append((old_parent, amount.copy_negate()))
    if new_parent is not None:
        updates.append((new_parent, amount))
    return updates
