"""Step 4's decisions against brute force: missing runs, duplicates, the watermark's reach,
the counter against its highest member."""

from __future__ import annotations

import itertools
from collections import Counter
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.protocol.gaps import (
    contiguous,
    counter_standing,
    duplicates,
    missing_runs,
)
from tally.rules import load_rules
from tests.integration.conftest import RULES_FILE

ISSUES = load_rules(RULES_FILE)["issue-numbers"]
held_numbers = st.lists(st.integers(0, 60), max_size=40).map(Counter)


@settings(max_examples=1000, deadline=None)
@given(st.integers(0, 30), st.integers(0, 70), held_numbers)
def test_missing_runs_are_exactly_the_unheld_numbers_as_maximal_runs(
    watermark: int, horizon: int, held: Counter[int]
) -> None:
    runs = list(missing_runs(watermark, horizon, held))
    listed = [n for low, high in runs for n in range(low, high + 1)]
    assert listed == [n for n in range(watermark + 1, horizon + 1) if not held[n]]
    for (_, high), (low, _) in itertools.pairwise(runs):
        assert low > high + 1  # a held number separates two runs
    assert all(low <= high for low, high in runs)


def test_a_run_of_a_billion_numbers_is_one_run_not_a_list() -> None:
    assert list(missing_runs(0, 10**9, Counter({5: 1}))) == [(1, 4), (6, 10**9)]


@settings(max_examples=1000, deadline=None)
@given(st.integers(0, 30), held_numbers)
def test_the_watermark_reaches_the_last_number_of_the_unbroken_run_above_it(
    watermark: int, held: Counter[int]
) -> None:
    reach = contiguous(watermark, held)
    assert all(held[n] for n in range(watermark + 1, reach + 1))
    assert not held[reach + 1]


@settings(max_examples=1000, deadline=None)
@given(held_numbers)
def test_duplicates_are_the_numbers_held_more_than_once_in_order(held: Counter[int]) -> None:
    found = duplicates(held)
    assert [n for n, _ in found] == sorted(n for n, c in held.items() if c > 1)
    assert all(held[n] == c for n, c in found)


counters = st.one_of(
    st.none(),
    st.integers(-5, 80).map(Decimal),
    st.decimals(allow_nan=True, allow_infinity=True, places=1),
    st.text(max_size=3),
    st.booleans(),
)


@settings(max_examples=1000, deadline=None)
@given(counters, st.integers(0, 70))
def test_the_counter_stands_when_it_is_a_whole_number_at_or_above_every_member(
    stored: Any, highest: int
) -> None:
    standing = counter_standing(ISSUES, stored, highest)
    whole = stored is None or (
        isinstance(stored, Decimal)
        and stored.is_finite()
        and stored >= 0
        and stored == stored.to_integral_value()
    )
    if not whole:
        assert standing == "invalid"
    else:
        assert standing == ("ok" if (stored or 0) >= highest else "behind")
