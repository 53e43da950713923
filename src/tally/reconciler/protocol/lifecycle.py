"""Parents that are gone (docs/verification.md, "Parents that are gone"): what a cascade
deleting a parent and its children may still change is judged on a second look, a grace
later, against what the first look saw."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from tally.core.numbers import NULL, subtract

# What a look saw: the counter (None: no parent) and the children's truth, as text.
Observed = tuple[str | None, str]


def observation(stored: Any, actual: Any) -> Observed:
    return (None if stored is None else str(stored)), str(actual)


def same(earlier: Observed | None, now: Observed) -> bool:
    """The same parent state (as numbers) at two looks."""
    if earlier is None or (earlier[0] is None) != (now[0] is None):
        return False
    return offset(earlier) == offset(now) and Decimal(earlier[1]) == Decimal(now[1])


def state_of(exists: bool, counter: Any, revision: Any) -> str:
    """A parent's state as text, to tell whether it moved between two moments: gone, or its
    counter and revision (numbers in canonical form, None for absent, other values by type)."""
    if not exists:
        return "gone"
    return f"{shown(counter)} {shown(revision)}"


def shown(value: Any) -> str:
    """A value as a state shows it: a number in canonical form, ``-`` absent, else its type."""
    if value is None or value is NULL:  # absent, or NULL (as a read shows it; None in a stream)
        return "-"
    if isinstance(value, Decimal) and value.is_finite():
        return format(value.normalize(), "f") if value else "0"
    return type(value).__name__


def held(earlier: Observed | None, now: Observed) -> bool:
    """The same counter and truth at two looks: as numbers, or (a counter that holds no
    number, shown by its type) exactly as shown."""
    if earlier is None:
        return False
    if tuple(earlier) == tuple(now):
        return True
    try:
        return same(earlier, now)
    except ArithmeticError:
        return False


def held_offset(earlier: Observed | None, now: Observed) -> bool:
    """The counter off from the truth by as much at two looks (the parent may have moved
    between: a stamped look judges it where it stands); a counter that holds no number,
    exactly as shown."""
    if earlier is None:
        return False
    if tuple(earlier) == tuple(now):
        return True
    try:
        return (earlier[0] is None) == (now[0] is None) and offset(earlier) == offset(now)
    except ArithmeticError:
        return False


def offset(observed: Observed) -> Decimal:
    stored, actual = observed
    return subtract(Decimal(stored or 0), Decimal(actual))


def emptied(
    grace_seconds: int | None,
    kind: str,
    actual: Any,
    counter_delta: Decimal,
    events: Iterable[str],
) -> bool:
    """A stream batch that only removed children (``events``) and left the parent with
    none: a deletion that takes the children first and the parent next (a BatchWriteItem
    is no transaction), judged on a second look a grace later, as orphans are."""
    seen = list(events)
    return (
        bool(grace_seconds)
        and kind == "drift"  # a TTL expiry is no application's deletion
        and not actual
        and not counter_delta
        and bool(seen)
        and all(event == "REMOVE" for event in seen)
    )
