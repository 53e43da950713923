"""The parent side of a count or sum write: ``ADD delta`` on the counter (and 1 on the
revision), conditioned so a refusal writes nothing, and the error a failed condition means."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal, localcontext
from typing import Any

import tally.writers.items as items
from tally.core.dynamodb import Cancelled, Names, serialize
from tally.core.regions import HOME
from tally.rules import Key, SumRule, TableKeys, TallyRule
from tally.writers.errors import InvalidCounterError, ParentNotFoundError
from tally.writers.transactions import REVISION_LIMIT, number_or_none, old_item, revision_guard


def total_limit(rule: TallyRule) -> Decimal:
    """The largest counter a writer adds to: 38 digits, ``scale`` of them decimal places."""
    scale = rule.scale if isinstance(rule, SumRule) else 0
    return Decimal((0, (9,) * items.MAX_DIGITS, -scale))


def parent_update(
    table: str,
    parent_key: Key,
    rule: TallyRule,
    delta: Decimal,
    keys: TableKeys,
    *,
    shard: bool = False,
) -> dict[str, Any]:
    """ADD delta to the counter and 1 to the revision, only on an existing parent whose
    counter and revision are numbers that stay exact after the ADD (every check in the
    update's own condition, so a refusal writes nothing).

    ``shard``: the key is a Region's shard of a counter split per Region, made by its first
    write (no revision; the parent is checked apart, ``parent_check``)."""
    partition_key = keys.partition_key
    revision_attribute = None if shard else rule.revision
    names = Names.of(None if shard else partition_key, rule.counter, revision_attribute)
    counter = names[rule.counter]
    adds = [f"{counter} :delta"]
    limit = total_limit(rule)
    # From these bounds (a number compares false with any other type), adding delta cannot
    # leave ±limit. Rounded inwards to the 38 digits an expression value may have.
    guards = [] if shard else [f"attribute_exists({names[partition_key]})"]
    guards.append(f"(attribute_not_exists({counter}) OR {counter} BETWEEN :low AND :high)")
    values: dict[str, Any] = {":delta": delta}
    with localcontext(Context(prec=items.MAX_DIGITS, rounding=ROUND_CEILING)):
        values[":low"] = -limit - delta
    with localcontext(Context(prec=items.MAX_DIGITS, rounding=ROUND_FLOOR)):
        values[":high"] = limit - delta
    revision, revision_values = revision_guard(names, revision_attribute)
    guards += revision
    values |= revision_values
    if revision_attribute is not None:
        adds.append(f"{names[revision_attribute]} :one")
        values[":one"] = Decimal(1)
    return {
        "Update": {
            "TableName": table,
            "Key": serialize(keys.typed(parent_key)),
            "UpdateExpression": "ADD " + ", ".join(adds),
            "ConditionExpression": " AND ".join(guards),
            "ExpressionAttributeNames": names.expression_names,
            "ExpressionAttributeValues": serialize(values),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def parent_check(table: str, parent_key: Key, keys: TableKeys, region: str) -> dict[str, Any]:
    """A split counter's parent, checked in the transaction that writes a shard: it exists,
    and names no home (``tallyHome``) but ``region``, as a parent a writer updates must."""
    names = Names.of(keys.partition_key, HOME)
    return {
        "ConditionCheck": {
            "TableName": table,
            "Key": serialize(keys.typed(parent_key)),
            "ConditionExpression": (
                f"attribute_exists({names[keys.partition_key]}) AND "
                f"(attribute_not_exists({names[HOME]}) OR {names[HOME]} = :region)"
            ),
            "ExpressionAttributeNames": names.expression_names,
            "ExpressionAttributeValues": serialize({":region": region}),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def judge_parent(parent: Mapping[str, Any] | None, key: Key, rule: TallyRule) -> Mapping[str, Any]:
    """The parent, after ParentNotFound or InvalidCounter for what a writer cannot add to."""
    if parent is None:
        raise ParentNotFoundError(key)
    scale = rule.scale if isinstance(rule, SumRule) else 0
    number_or_none(parent, rule.counter, key, limit=total_limit(rule), scale=scale)
    if rule.revision is not None:
        number_or_none(parent, rule.revision, key, limit=REVISION_LIMIT, scale=0)
    return parent


def raise_for_parent(
    cancelled: Cancelled,
    index: int,
    key: Key,
    rule: TallyRule,
    delta: Decimal,
    out_of_range: Exception | None = None,
) -> None:
    """Turn the parent's failed condition into ParentNotFound or InvalidCounter, or, when its
    numbers are fine, ``out_of_range`` (a sum's total would leave the range it keeps)."""
    if not cancelled.failed(index):
        return
    parent = judge_parent(old_item(cancelled, index), key, rule)
    if out_of_range is not None:
        raise out_of_range
    value = parent.get(rule.counter)
    raise InvalidCounterError(
        key, rule.counter, value, f"holds {value}: adding {delta} would pass ±{total_limit(rule)}"
    )
