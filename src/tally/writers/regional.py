"""A writer's transaction on a multi-Region table, stamped with what ``tally.core.regions``
names: the origin Region on every item written, an id on every child or member created, and
on every parent's counter update one more of this Region's writes; every update fenced on
the item's home Region (``tallyHome``), where the item names one."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tally.core.regions import CHILD_ID, HOME, ORIGIN, writes

_CLAUSE = {name: re.compile(rf"(?<![#:\w.]){name}\b", re.IGNORECASE) for name in ("ADD", "SET")}


def new_child_id(region: str) -> str:
    return f"{region}:{uuid.uuid4().hex}"


def _into_clause(expression: str, clause: str, assignment: str) -> str:
    """The update expression with ``assignment`` first in its ``clause`` (added if absent)."""
    pattern = _CLAUSE[clause]
    if pattern.search(expression):
        return pattern.sub(f"{clause} {assignment},", expression, count=1)
    return f"{expression} {clause} {assignment}".strip()


# Only the item's home Region, when it names one, may change it (``tally.core.regions.HOME``).
_HOMED = "(attribute_not_exists(#tallyHome) OR #tallyHome = :tallyOrigin)"


def _stamp_update(update: Mapping[str, Any], region: str, fence_home: bool) -> dict[str, Any]:
    out = dict(update)
    names = dict(out.get("ExpressionAttributeNames", {}))
    values = dict(out.get("ExpressionAttributeValues", {}))
    expression = out.get("UpdateExpression", "")
    names["#tallyOrigin"] = ORIGIN
    values[":tallyOrigin"] = {"S": region}
    expression = _into_clause(expression, "SET", "#tallyOrigin = :tallyOrigin")
    if ":delta" in values and _CLAUSE["ADD"].search(expression):
        # A parent's counter (``parents.parent_update``'s ADD of ``:delta``): one more write
        # of this Region's.
        names["#tallyWrites"] = writes(region)
        values[":tallyOne"] = {"N": "1"}
        expression = _into_clause(expression, "ADD", "#tallyWrites :tallyOne")
    out |= {
        "UpdateExpression": expression,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }
    if fence_home:
        names["#tallyHome"] = HOME
        condition = out.get("ConditionExpression")
        out["ConditionExpression"] = f"{grouped(condition)} AND {_HOMED}" if condition else _HOMED
        out.setdefault("ReturnValuesOnConditionCheckFailure", "ALL_OLD")
    return out


def grouped(condition: str) -> str:
    """The condition as one operand of an AND: in parentheses, unless one pair already holds
    all of it (DynamoDB refuses redundant parentheses)."""
    condition = condition.strip()
    depth = 0
    for at, char in enumerate(condition):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return condition if at == len(condition) - 1 and char == ")" else f"({condition})"
    return f"({condition})"


def homed_elsewhere(item: Mapping[str, Any] | None, region: str) -> str | None:
    """The home Region an item refused this Region's write for, if that is why (the item as
    its failed condition returned it, deserialized)."""
    home = (item or {}).get(HOME)
    return home if isinstance(home, str) and home != region else None


def _creates(put: Mapping[str, Any]) -> bool:
    return "attribute_not_exists" in put.get("ConditionExpression", "")


def stamped(
    actions: Sequence[Mapping[str, Any]],
    region: str,
    child_id: Callable[[str], str] = new_child_id,
    *,
    fence_home: bool = True,
) -> list[dict[str, Any]]:
    """A transaction's actions with this Region's stamps (deletes and checks as they are);
    each update fenced on the item's home, if it names one, being this Region."""
    out: list[dict[str, Any]] = []
    for action in actions:
        [(kind, detail)] = action.items()
        if kind == "Put":
            item = {**detail["Item"], ORIGIN: {"S": region}}
            if _creates(detail) and CHILD_ID not in item:
                item[CHILD_ID] = {"S": child_id(region)}
            out.append({"Put": {**detail, "Item": item}})
        elif kind == "Update":
            out.append({"Update": _stamp_update(detail, region, fence_home)})
        else:
            out.append(dict(action))
    return out


def stamped_update(
    request: Mapping[str, Any], region: str, *, fence_home: bool = True
) -> dict[str, Any]:
    """An ``UpdateItem`` request (a counter's ADD outside a transaction) with the stamps."""
    return _stamp_update(request, region, fence_home)
