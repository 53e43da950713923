"""Step 1, the fast path: did one batch's writes to a parent cancel out exactly?

A balanced batch proves that nothing new drifted, with zero reads: every drift is introduced
by some write, and every write passes through the stream.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from decimal import Decimal


def counts_balance(counter_delta: Decimal, child_delta: Decimal) -> bool:
    """A count or sum: the counter moved by exactly what its children did (exact sums, an
    exact comparison)."""
    return counter_delta == child_delta


def numbers_balance(handed_out: Sequence[tuple[int, int]], inserted: Mapping[int, int]) -> bool:
    """A sequence: each number the counter handed out (as ranges ``low..high``) has exactly
    one member insert, and nothing else was inserted."""
    handed = sum(high - low + 1 for low, high in handed_out)
    if handed != sum(inserted.values()):
        return False
    ranges = sorted(handed_out)
    lows = [low for low, _ in ranges]
    for number, count in inserted.items():
        at = bisect.bisect_right(lows, number) - 1
        if count != 1 or at < 0 or number > ranges[at][1]:
            return False
    return True
