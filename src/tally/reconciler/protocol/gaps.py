"""Step 4's decisions on a sequence: the numbers missing between the watermark and the
horizon, numbers held twice, how far the watermark may move, and the counter against its
highest member."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from tally.reconciler.protocol.judgement import valid_counter
from tally.rules import SequenceRule


def missing_runs(
    watermark: int, horizon: int, held: Mapping[int, int]
) -> Iterator[tuple[int, int]]:
    """Runs of numbers in (watermark, horizon] that no member holds, without listing them."""
    expected = watermark + 1
    for number in sorted(n for n in held if watermark < n <= horizon):
        if number > expected:
            yield expected, number - 1
        expected = number + 1
    if expected <= horizon:
        yield expected, horizon


def duplicates(held: Mapping[int, int]) -> list[tuple[int, int]]:
    """(number, how many members hold it) for every number held more than once, in order."""
    return sorted((number, count) for number, count in held.items() if count > 1)


def contiguous(watermark: int, held: Mapping[int, int]) -> int:
    """The highest number up to which every number past the watermark is held."""
    while held.get(watermark + 1):
        watermark += 1
    return watermark


def counter_standing(
    rule: SequenceRule, stored: Any, highest: int
) -> Literal["ok", "behind", "invalid"]:
    """The counter against its highest member: the next number it hands out must be free."""
    if not valid_counter(rule, stored):
        return "invalid"
    return "ok" if int(stored or 0) >= highest else "behind"
