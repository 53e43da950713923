"""The parent side of a count or sum write: ``ADD delta`` on the counter (and 1 on the
revision), conditioned so a refusal writes nothing, and the error a failed condition means."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal, localcontext
from typing import Any

import tally.writers.items as items
from tally.core.dynamodb import Cancelled, Names, serialize
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
) -> dict[str, Any]:
    """ADD delta to the counter and 1 to the revision, only on an existing parent whose
    counter and revision are numbers that stay exact after the ADD (every check in the
    update's own condition, so a refusal writes nothing)."""
    partition_key = keys.partition_key
    names = Names.of(partition_key, rule.counter, rule.revision)
    counter = names[rule.counter]
    adds = [f"{counter} :delta"]
    limit = total_limit(rule)
    # From these bounds (a number compares false with any other type), adding delta cannot
    # leave ±limit. Rounded inwards to the 38 digits an expression value may have.
    guards = [
        f"attribute_exists({names[partition_key]})",
        f"(attribute_not_exists({counter}) OR {counter} BETWEEN :low AND :high)",
    ]
    values: dict[str, Any] = {":delta": delta}
    with localcontext(Context(prec=items.MAX_DIGITS, rounding=ROUND_CEILING)):
        values[":low"] = -limit - delta
    with localcontext(Context(prec=items.MAX_DIGITS, rounding=ROUND_FLOOR)):
        values[":high"] = limit - delta
    revision, revision_values = revision_guard(names, rule.revision)
    guards += revision
    values |= revision_values
    if rule.revision is not None:
        adds.append(f"{names[rule.revision]} :one")
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
