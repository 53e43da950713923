"""Step 1b, the carry: a hot parent's remainder (counter deltas - child deltas) folded from
the stream, record by record, each at most once (only records past ``through``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from tally.core.numbers import Unrepresentable, add, fit, subtract

# A carry's recheck never comes sooner: the carry item it looks for is written after it is
# scheduled, within the same group's work.
MIN_CARRY_DELAY = 2


@dataclass(frozen=True)
class Carry:
    """A parent's remainder (counter deltas - child deltas) folded from the stream so far.

    ``through``: the last stream sequence number folded in (-1: none yet); ``since``: when
    the remainder last became non-zero (epoch ms, 0 while it is zero), naming its recheck.
    """

    remainder: Decimal = Decimal(0)
    through: int = -1
    since: int = 0
    first_seen: str | None = None


@dataclass(frozen=True)
class Fold:
    """What folding a group's records did to the carry.

    ``outcome``: ``folded before`` (every record is at or below ``through``: nothing to
    write), ``balanced`` (the remainder is zero), ``continued`` (a remainder that never
    returned to zero: its recheck is already scheduled), ``opened`` (a new remainder: it
    needs a recheck of its own), ``too large`` (more digits than the audit table holds:
    recount instead).
    """

    outcome: Literal["folded before", "balanced", "continued", "opened", "too large"]
    carry: Carry | None = None


def fold(
    previous: Carry,
    through: int,
    deltas: Iterable[tuple[str, Decimal]],
    now_ms: int,
    first_seen: str | None = None,
) -> Fold:
    """Fold a group's records, up to sequence number ``through``, into the carry: each
    share (sequence number, counter delta - child delta) past ``previous.through`` once.

    The remainder continues only while it never returns to zero: once the records cancelled
    it, whatever follows is a new remainder with a window of its own.
    """
    if through <= previous.through:
        return Fold("folded before")
    remainder, continues = previous.remainder, bool(previous.remainder)
    for number, delta in deltas:
        if int(number) > previous.through:
            remainder = add(remainder, delta)
            continues = continues and bool(remainder)
    try:
        remainder = fit(remainder)
    except Unrepresentable:
        return Fold("too large")
    if not remainder:
        return Fold("balanced", Carry(Decimal(0), through))
    if continues:
        return Fold("continued", replace(previous, remainder=remainder, through=through))
    return Fold("opened", Carry(remainder, through, now_ms, first_seen))


def take_off(seen: Carry, now: Carry, now_ms: int) -> Carry | None:
    """The carry after a recount that covered the remainder ``seen``: what was folded since
    keeps its own window. None: more digits than the audit table holds (recount it all)."""
    try:
        remainder = fit(subtract(now.remainder, seen.remainder))
    except Unrepresentable:
        return None
    if not remainder:
        return Carry(Decimal(0), now.through)
    return Carry(remainder, now.through, now_ms, now.first_seen)


def window_left(first_at: Any, now: float, window: int) -> int:
    """Whole seconds of a ``window`` that began at a stream time (``first_at``, epoch seconds
    rounded down to the second, so taken as the end of that second) still to run at ``now``:
    between MIN_CARRY_DELAY and ``window``; the whole window when the time is no plausible one."""
    if window <= MIN_CARRY_DELAY:
        return window
    try:
        if isinstance(first_at, datetime):
            began = first_at.timestamp() + 1
        elif isinstance(first_at, int | float | Decimal) and not isinstance(first_at, bool):
            began = float(first_at) + 1
        else:
            return window
    except (ArithmeticError, ValueError, OverflowError):
        return window
    if not (math.isfinite(began) and began <= now):  # no time, or a clock ahead of ours
        return window
    return max(MIN_CARRY_DELAY, min(window, math.ceil(window - (now - began))))
