"""The writers' stamps on children found through an index (a rule with ``through.stamp``):
each transaction writes a fresh token (``tally.core.stamps``) on the child and, on each
parent it changes, that token (the child's last one, marked, when the child leaves it) ahead
of the parent's last ones, with the child's key. So a look can prove that every change a
moving parent took reached the stream's window (docs/verification.md, "Parents that never
rest")."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import serialize
from tally.core.stamps import MILLISECOND_DIGITS, RANDOM_DIGITS, key_mark, removed
from tally.rules import IndexChildren, Key, TallyRule

NONE_YET = ""  # a place no write has filled yet


def stamping(rule: TallyRule) -> IndexChildren | None:
    """The rule's index, when its writers stamp; None otherwise."""
    through = rule.through
    return through if through is not None and through.stamp is not None else None


def stamp_child(entry: dict[str, Any], through: IndexChildren, token: str) -> None:
    """Write ``token`` on the child with its Put or Update (a Delete writes nothing)."""
    assert through.stamp is not None
    if "Put" in entry:
        entry["Put"]["Item"][through.stamp] = {"S": token}
    elif "Update" in entry:
        _set(entry["Update"], {through.stamp: token}, {})


def new_token(child: Mapping[str, Any]) -> str:
    """A fresh token (``tally.core.stamps``) for a change of the child at key ``child``."""
    made = f"{int(time.time() * 1000):0{MILLISECOND_DIGITS}x}"
    return f"{made}{key_mark(child)}{secrets.token_hex(4)[:RANDOM_DIGITS]}"


def parent_stamp(token: str, old: Any, joins: bool) -> str:
    """What a parent takes: the transaction's token when the child joins it (or stays and
    changes), else the child's last token marked; ``?`` and this token for a child no
    writer stamped."""
    return token if joins else removed(old) or f"?{token}"


def stamp_parent(
    update: dict[str, Any], through: IndexChildren, stamp: str, child: Key, delta: Decimal
) -> None:
    """Shift the parent's stamps one place down (the oldest drops out), put ``stamp`` first,
    the child's key beside it, and add ``delta`` to the writers' total. DynamoDB reads every
    operand as the item was before the update, so the shift needs no read."""
    places = through.stamps
    shifted = {places[i]: places[i - 1] for i in range(len(places) - 1, 0, -1)}
    assert through.stamp_child is not None and through.stamp_total is not None
    request = update["Update"]
    _set(request, {places[0]: stamp, through.stamp_child: _key_json(child)}, shifted)
    request["ExpressionAttributeNames"]["#stt"] = through.stamp_total
    request["ExpressionAttributeValues"].update(serialize({":std": delta}))
    expression = request["UpdateExpression"]
    assert "ADD " in expression  # parents.parent_update's ADD to the counter
    request["UpdateExpression"] = expression.replace("ADD ", "ADD #stt :std, ", 1)


def _key_json(key: Mapping[str, Any]) -> str:
    return json.dumps({k: str(v) for k, v in key.items()}, sort_keys=True, ensure_ascii=False)


def _set(request: dict[str, Any], values: Mapping[str, str], copies: Mapping[str, str]) -> None:
    """Add ``SET name = value`` and ``SET name = if_not_exists(other, "")`` actions to an
    update request, under placeholders of their own."""
    names = request.setdefault("ExpressionAttributeNames", {})
    bound = request.setdefault("ExpressionAttributeValues", {})
    actions = []
    for i, (name, source) in enumerate(copies.items()):
        names[f"#st{i}"], names[f"#sf{i}"] = name, source
        actions.append(f"#st{i} = if_not_exists(#sf{i}, :stnone)")
    if copies:
        bound.update(serialize({":stnone": NONE_YET}))
    for i, (name, value) in enumerate(values.items()):
        names[f"#sv{i}"] = name
        bound.update(serialize({f":sv{i}": value}))
        actions.append(f"#sv{i} = :sv{i}")
    expression = request.get("UpdateExpression", "")
    if "SET " in expression:
        request["UpdateExpression"] = expression.replace("SET ", f"SET {', '.join(actions)}, ", 1)
    else:
        request["UpdateExpression"] = f"SET {', '.join(actions)} {expression}".strip()
