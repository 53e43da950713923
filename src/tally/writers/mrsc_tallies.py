"""``TallyWriter``'s calls on an MRSC table (``tally.writers.mrsc``): the child's write, then
the counter's, each sent again on a conflict or a lost answer without counting twice.

A counter write the table refuses (no parent, a counter no writer adds to, a conflict that
outlasted the budget) wrote nothing; the child written just before is then taken back (an
add's child deleted, a change's amount set back, only where it still holds this call's
token) and the refusal raised, so a refused call leaves nothing. A removal cannot be taken
back: its refusal leaves the counter ahead, for the reconciler. A counter write whose answer
stays lost raises with the child in place: the counter is right or behind, for the same.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from functools import partial
from typing import Any

from botocore.exceptions import ClientError

from tally.core.dynamodb import serialize
from tally.rules import Key, SumRule, TallyRule
from tally.writers.errors import Field, InvalidCounterError, InvalidRequestError
from tally.writers.fenced import fenced_writes
from tally.writers.mrsc import CHANGED, MARK, StrongWrites, applied, new_mark, ringed
from tally.writers.parents import judge_parent, parent_update, total_limit
from tally.writers.transactions import retrying

# (outcome, sends): the most times one of the call's writes went out.
Done = tuple[str, int]


def refuse(rule: TallyRule, idempotency_key: str | None) -> None:
    """What MRSC cannot do: a guard item needs the request's own transaction, and a child
    found through an index is moved between parents in one."""
    if idempotency_key is not None:
        raise InvalidRequestError(
            ("idempotency_key",),
            "an idempotency key's guard is written in its request's transaction, which a "
            "multi-Region strongly consistent table refuses: retry without one (a repeated "
            "add answers already_present, a repeated remove not_present)",
        )
    if rule.through is not None:
        raise InvalidRequestError(
            ("key",),
            f"rule {rule.name!r} counts children through an index: its writes move a count "
            "between parents in one transaction, which a multi-Region strongly consistent "
            "table refuses",
        )


def add(
    strong: StrongWrites,
    rule: TallyRule,
    parent_key: Key,
    item: dict[str, Any],
    delta: Decimal,
    amount: Field | None,
) -> Done:
    """The child's Put if absent, then ``ADD delta``: ``created`` or ``already_present``."""
    token = new_mark()
    key = {name: item[name] for name in strong.keys.names}

    def check() -> dict[str, Any] | None:
        # After a Put that may have been written: our child is there, or it was, and another
        # call has since removed it (and taken it off the counter under its token).
        child = strong.get(key)
        if child is not None:
            return child if child.get(MARK) == token else None
        return {} if applied(strong.get(parent_key), f"{token}-") else None

    put = strong.put_new(item, token, check)
    if not put.ok:
        return "already_present", put.sends
    undo = partial(strong.undo_put, key, token)
    sends = count(strong, rule, parent_key, delta, token, amount, undo)
    return "created", max(put.sends, sends)


def remove(strong: StrongWrites, rule: TallyRule, key: Key, parent_key: Key) -> Done:
    """Read the child; if present, its Delete (a sum's fenced on the amount read), then
    ``ADD -amount``: ``removed`` or ``not_present``."""
    return _read_and_write(strong, "remove", rule, key, parent_key, None)


def change(strong: StrongWrites, rule: SumRule, key: Key, parent_key: Key, new: Decimal) -> Done:
    """Set a sum child's amount (fenced on the amount read), then ``ADD new-old``."""
    return _read_and_write(strong, "change", rule, key, parent_key, new)


def count(
    strong: StrongWrites,
    rule: TallyRule,
    parent_key: Key,
    delta: Decimal,
    token: str,
    amount: Field | None,
    undo: Callable[[], None] | None = None,
) -> int:
    """``ADD delta`` to the parent's counter (and 1 to its revision) once, under ``token``;
    on a refusal, ``undo`` the child's write and raise what the refusal means."""
    update = parent_update(strong.table_name, parent_key, rule, delta, strong.keys)["Update"]

    def check() -> dict[str, Any] | None:
        parent = strong.get(parent_key)
        return parent if applied(parent, token) else None

    try:
        sent = strong.update(ringed(update, token), check)
    except ClientError:
        if undo is not None:
            undo()
        raise
    if sent.ok or applied(sent.item, token):
        return sent.sends
    if undo is not None:
        undo()
    parent = judge_parent(sent.item, parent_key, rule)
    if amount is not None:
        raise InvalidRequestError(
            amount, f"the parent's {rule.counter!r} would pass ±{total_limit(rule)}"
        )
    value = parent.get(rule.counter)
    raise InvalidCounterError(
        parent_key,
        rule.counter,
        value,
        f"holds {value}: adding {delta} would pass ±{total_limit(rule)}",
    )


def _read_and_write(
    strong: StrongWrites,
    operation: str,
    rule: TallyRule,
    key: Key,
    parent_key: Key,
    new: Decimal | None,
) -> Done:
    """Read the child, write it fenced on what was read (``fenced.fenced_writes``; a Delete
    also on the child's ``MARK``, so it removes the child that was read and not one made
    since), read again if it changed in between; then the counter."""
    token = new_mark()
    sends = 0
    for _ in retrying(strong.backoff):
        current = strong.get(key)
        if current is None:
            return "not_present", sends
        planned = fenced_writes(
            strong.table_name, strong.keys, operation, key, parent_key, rule, current, new, None
        )
        if planned is None:
            return "unchanged", sends
        entry, [(parent, delta)] = planned
        [(kind, request)] = entry.items()
        request = {**request, "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
        mark = current.get(MARK)
        if kind == "Update":
            sent = strong.update(_with(request, "SET #changed = :changed", {":changed": token}))
            sends = max(sends, sent.sends)
            if not sent.ok and (sent.item or {}).get(CHANGED) != token:
                continue  # the amount changed since it was read
            undo = _undo_change(strong, rule, key, current, token)
            counted = count(strong, rule, parent, delta, token, ("amount",), undo)
            return "changed", max(sends, counted)
        sent = strong.send("delete_item", _with(request, "", {":mark": mark}))
        sends = max(sends, sent.sends)
        if not sent.ok and sent.item is not None and sent.item.get(MARK) == mark:
            continue  # its amount changed since it was read
        if not sent.ok and not sent.resent:
            if sent.item is not None:
                continue  # removed and made again since it was read: remove that one
            return "not_present", sends  # another call removed it, and counts it
        # Gone after a send that may have been written: ours, or another call's whose
        # decrement carries the same token (the child's), so only one is applied.
        once = f"{mark}-" if isinstance(mark, str) else token
        counted = count(strong, rule, parent, delta, once, ("key",))
        return "removed", max(sends, counted)
    raise RuntimeError(f"child {key} kept changing over {strong.backoff.rounds} attempts")


def _with(request: dict[str, Any], action: str, values: dict[str, Any]) -> dict[str, Any]:
    """The child's write with one more action (an Update's ``SET``: this call's token in
    ``CHANGED``) or, without one, one more condition: the child's ``MARK`` as read."""
    names = {**request["ExpressionAttributeNames"], "#mark": MARK, "#changed": CHANGED}
    bound = dict(request.get("ExpressionAttributeValues", {}))
    out = dict(request)
    if action:
        del names["#mark"]
        bound |= serialize(values)
        out["UpdateExpression"] = request["UpdateExpression"].replace(
            "SET ", "SET #changed = :changed, ", 1
        )
    else:
        del names["#changed"]
        mark = values[":mark"]
        test = "#mark = :mark" if isinstance(mark, str) else "attribute_not_exists(#mark)"
        bound |= serialize(values) if isinstance(mark, str) else {}
        out["ConditionExpression"] = f"({request['ConditionExpression']}) AND {test}"
    out["ExpressionAttributeNames"] = names
    if bound:
        out["ExpressionAttributeValues"] = bound
    return out


def _undo_change(
    strong: StrongWrites, rule: TallyRule, key: Key, current: dict[str, Any], token: str
) -> Callable[[], None]:
    """Set the amount back to what was read, where the child still holds this call's change."""
    assert isinstance(rule, SumRule)

    def undo() -> None:
        strong.update(
            {
                "TableName": strong.table_name,
                "Key": serialize(strong.keys.typed(key)),
                "UpdateExpression": "SET #amount = :old",
                "ConditionExpression": "#changed = :mark",
                "ExpressionAttributeNames": {"#amount": rule.summed, "#changed": CHANGED},
                "ExpressionAttributeValues": serialize(
                    {":old": current.get(rule.summed, Decimal(0)), ":mark": token}
                ),
            }
        )

    return undo
