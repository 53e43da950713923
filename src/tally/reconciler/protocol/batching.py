"""How one stream batch's work is laid out in time: which groups share an item collection
(and so are verified in order, by one worker), and how much of a carry's window is left
when its recheck is scheduled."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from tally.rules import Key

# A carry's recheck never comes sooner: the carry item it looks for is written after it is
# scheduled, within the same group's work.
MIN_CARRY_DELAY = 2


class Grouped(Protocol):
    @property
    def parent_key(self) -> Key: ...


G = TypeVar("G", bound=Grouped)


def item_collections(groups: Iterable[G], partition_key: str) -> list[list[G]]:
    """Groups by their parent's partition key, in the batch's order."""
    collections: dict[Any, list[G]] = {}
    for group in groups:
        collections.setdefault(group.parent_key[partition_key], []).append(group)
    return list(collections.values())


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
