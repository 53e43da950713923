"""A child's write fenced on the item as read (transactions cannot read): present, a sum's
amount, an indexed child's index key values; and the parents' deltas that write implies. A
concurrent change to any of them cancels the write, and the writer reads again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Context, Decimal, localcontext
from typing import Any

import tally.writers.indexed as indexed
import tally.writers.items as items
from tally.core.dynamodb import Names, serialize
from tally.rules import Key, SumRule, TableKeys, TallyRule
from tally.writers.errors import InvalidCounterError, InvalidRequestError
from tally.writers.transactions import number_or_none

# Exact differences of two DynamoDB numbers (exponents -168..125) fit in 300 digits.
_EXACT = Context(prec=300)


@dataclass(frozen=True)
class Fence:
    """The condition a stored child must still meet to be written as read: present, its index
    key values as read (absent where it had none), and for a sum its amount."""

    condition: str
    names: Names
    values: dict[str, Any]


def fence(rule: TallyRule, keys: TableKeys, current: Mapping[str, Any]) -> Fence:
    """``attribute_exists`` of the key, each index attribute (rules with ``through``) as
    ``current`` holds it, and for a sum rule its amount (absent when the item holds none, 0
    or absent when it holds 0)."""
    index = rule.through.attributes if rule.through is not None else ()
    fenced = [name for name in index if name not in keys.names]
    summed = rule.summed if isinstance(rule, SumRule) else None
    names = Names.of(keys.partition_key, *fenced, summed)
    conditions = [f"attribute_exists({names[keys.partition_key]})"]
    values: dict[str, Any] = {}
    for position, name in enumerate(fenced):
        if name in current:
            placeholder = f":index{position}"
            conditions.append(f"{names[name]} = {placeholder}")
            values[placeholder] = current[name]
        else:
            conditions.append(f"attribute_not_exists({names[name]})")
    if summed is not None:
        amount = current.get(summed)
        if isinstance(amount, Decimal):
            nothing = f" OR attribute_not_exists({names[summed]})" if amount == 0 else ""
            conditions.append(f"({names[summed]} = :old{nothing})")
            values[":old"] = amount
        else:
            conditions.append(f"attribute_not_exists({names[summed]})")
    return Fence(" AND ".join(conditions), names, values)


def fenced_writes(
    table_name: str,
    keys: TableKeys,
    operation: str,
    key: Key,
    parent_key: Key,
    rule: TallyRule,
    current: dict[str, Any],
    new: Decimal | None,
    index: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], list[tuple[Key, Decimal]]] | None:
    """The child's write (``remove``, ``change`` its amount to ``new``, ``move`` its index
    keys to ``index``) fenced on ``current``, and the parents' deltas; None when the request
    would change nothing. ``parent_key`` is the parent of a child in its parent's item
    collection; an indexed child's parents are the ones its images name."""
    old = stored_amount(rule, current, key) if isinstance(rule, SumRule) else Decimal(1)
    parent: Key | None = parent_key
    if rule.through is not None:
        parent = rule.indexed_parent(current, keys)
    fenced = fence(rule, keys, current)
    names, values = fenced.names, dict(fenced.values)
    child: dict[str, Any] = {
        "TableName": table_name,
        "Key": serialize(keys.typed(key)),
        "ConditionExpression": fenced.condition,
        "ExpressionAttributeNames": names.expression_names,
    }
    parents: list[tuple[Key, Decimal]] = []
    if operation == "remove":
        entry = {"Delete": child}
        parents = [(parent, old.copy_negate())] if parent is not None else []
    elif operation == "change":
        assert isinstance(rule, SumRule) and new is not None
        if new == old:
            return None
        items.check_size({**current, rule.summed: new}, ("amount",))
        child["UpdateExpression"] = f"SET {names[rule.summed]} = :new"
        values[":new"] = new
        entry = {"Update": child}
        parents = [(parent, difference(new, old))] if parent is not None else []
    else:
        assert index is not None
        moved = {**current, **index}
        image = {name: value for name, value in moved.items() if value is not None}
        if image == current:
            return None
        new_parent = moved_parent(rule, keys, image)
        items.check_size(image, ("attributes",))
        sets = [n for n, v in index.items() if v is not None]
        removes = [n for n, v in index.items() if v is None]
        expression = ", ".join(f"{names[n]} = :set{i}" for i, n in enumerate(sets))
        values |= {f":set{i}": index[n] for i, n in enumerate(sets)}
        child["UpdateExpression"] = " ".join(
            [f"SET {expression}"] * bool(sets)
            + [f"REMOVE {', '.join(names[n] for n in removes)}"] * bool(removes)
        )
        entry = {"Update": child}
        parents = indexed.moves(parent, new_parent, old)
    if values:
        child["ExpressionAttributeValues"] = serialize(values)
    return entry, parents


def within_domain(amount: Decimal, rule: SumRule) -> bool:
    """Whether ``amount`` lies in the rule's amount domain: at most ``scale`` decimal places
    and at most ``max_amount`` either side of 0."""
    if amount.copy_abs() > rule.max_amount:
        return False
    return amount == amount.quantize(Decimal(1).scaleb(-rule.scale), context=_EXACT)


def stored_amount(rule: SumRule, current: Mapping[str, Any], key: Key) -> Decimal:
    """The child's amount as stored (0 when absent), judged as an amount a writer adds is:
    InvalidCounterError naming it when it is not a number or lies outside the rule's amount
    domain (another writer's): taken off or moved, it would carry the total off the domain's
    grid or past the range the writers keep, or past what DynamoDB can add exactly."""
    amount = number_or_none(current, rule.summed, key) or Decimal(0)
    if not within_domain(amount, rule):
        raise InvalidCounterError(
            key,
            rule.summed,
            amount,
            f"holds {amount}, outside rule {rule.name!r}'s amount domain (at most "
            f"{rule.scale} decimal places and at most {rule.max_amount} either side of 0): "
            "a writer takes off or moves only an amount it could have added",
        )
    return amount


def moved_parent(rule: TallyRule, keys: TableKeys, image: Mapping[str, Any]) -> Key | None:
    """The parent a moved child's image names; None when it leaves the count on purpose
    (no index key, another status), a refusal when its index key names no parent."""
    if rule.indexed_parent(image, keys) is None and indexed.leaves_deliberately(rule, image):
        return None
    return indexed.named_parent(rule, image, keys, ("attributes",))


def difference(new: Decimal, old: Decimal) -> Decimal:
    """``new - old`` exactly, or a refusal on the amount if DynamoDB cannot add it."""
    with localcontext(_EXACT):
        delta = new - old
    try:
        return items.number(delta, ("amount",))
    except InvalidRequestError:
        raise InvalidRequestError(
            ("amount",),
            f"changing {old} to {new} moves the total by {delta}, "
            "more digits than DynamoDB can add in one number",
        ) from None
