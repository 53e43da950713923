"""The writers' stamps on children found through an index (a rule with ``through.stamp``):
each transaction writes a fresh token on the child and, on each parent it changes, that
token (the child's last one, marked, when the child leaves it) ahead of the parent's last
ones, with the child's key. So a look can prove that every change a moving parent took
reached the stream's window (docs/verification.md, "Parents that never rest")."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

from tally.core.dynamodb import serialize
from tally.rules import IndexChildren, Key, TallyRule

NONE_YET = ""  # a place no write has filled yet


def stamping(rule: TallyRule) -> IndexChildren | None:
    """The rule's index, when its writers stamp; None otherwise."""
    through = rule.through
    return through if through is not None and through.stamp is not None else None


def new_token() -> str:
    """The second it is made (9 hex digits) and 60 random bits: protocol.stamps.TOKEN."""
    return f"{int(time.time()):09x}{secrets.token_hex(8)[:15]}"


def removed(token: Any) -> str:
    """What a parent takes when a child leaves it: the child's token, marked ("?" for a child
    no writer stamped: no note can match it)."""
    return f"-{token}" if isinstance(token, str) and token else "?"


def stamp_child(entry: dict[str, Any], through: IndexChildren, token: str) -> None:
    """Write ``token`` on the child with its Put or Update (a Delete writes nothing)."""
    assert through.stamp is not None
    if "Put" in entry:
        entry["Put"]["Item"][through.stamp] = {"S": token}
    elif "Update" in entry:
        _set(entry["Update"], {through.stamp: token}, {})


def stamp_parent(update: dict[str, Any], through: IndexChildren, stamp: str, child: Key) -> None:
    """Shift the parent's stamps one place down (the oldest drops out), put ``stamp`` first,
    and the child's key beside it. DynamoDB reads every operand as the item was before the
    update, so the shift needs no read."""
    places = through.stamps
    shifted = {places[i]: places[i - 1] for i in range(len(places) - 1, 0, -1)}
    assert through.stamp_child is not None
    _set(update["Update"], {places[0]: stamp, through.stamp_child: _key_json(child)}, shifted)


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
