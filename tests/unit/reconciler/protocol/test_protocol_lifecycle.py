"""Parents that are gone: two looks agree only on the same state; only a batch that removed
children, and nothing else, waits for a cascade."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.protocol.lifecycle import emptied, held, observation, same, state_of

counters = st.one_of(st.none(), st.integers(-5, 50).map(Decimal))
actuals = st.integers(0, 50).map(Decimal)


@settings(max_examples=1000, deadline=None)
@given(counters, actuals, counters, actuals)
def test_two_looks_agree_exactly_when_counter_and_truth_are_the_same_numbers(
    stored: Any, actual: Decimal, stored_later: Any, actual_later: Decimal
) -> None:
    first, second = observation(stored, actual), observation(stored_later, actual_later)
    assert same(first, first)
    assert same(first, second) == same(second, first)
    expected = (stored is None) == (stored_later is None) and (
        (stored or 0) - actual == (stored_later or 0) - actual_later and actual == actual_later
    )
    assert same(first, second) == expected
    assert not same(None, second)


def test_equal_numbers_written_differently_are_the_same_look() -> None:
    assert same(observation(Decimal("3.0"), Decimal("1")), observation(Decimal(3), Decimal("1.00")))


events = st.lists(st.sampled_from(["INSERT", "MODIFY", "REMOVE"]), max_size=6)


@settings(max_examples=1000, deadline=None)
@given(
    st.one_of(st.none(), st.integers(0, 60)),
    st.sampled_from(["drift", "ttl_removal", "orphans", "invalid_counter"]),
    st.integers(0, 3).map(Decimal),
    st.integers(-2, 2).map(Decimal),
    events,
)
def test_only_a_batch_of_removals_that_left_no_child_waits_for_a_cascade(
    grace: int | None, kind: str, actual: Decimal, counter_delta: Decimal, seen: list[str]
) -> None:
    waits = emptied(grace, kind, actual, counter_delta, seen)
    assert waits == (
        bool(grace)
        and kind == "drift"
        and actual == 0
        and counter_delta == 0
        and bool(seen)
        and set(seen) == {"REMOVE"}
    )


shown = st.one_of(
    counters.map(lambda c: None if c is None else str(c)), st.sampled_from(["S", "BOOL"])
)


@settings(max_examples=1000, deadline=None)
@given(shown, actuals, shown, actuals)
def test_a_finding_held_across_a_grace_only_when_counter_and_truth_are_unchanged(
    stored_1: str | None, actual_1: Decimal, stored_2: str | None, actual_2: Decimal
) -> None:
    """Children found through an index: the second recount confirms the first only when it
    saw the same counter (a number, or the same non-number type) and the same truth."""
    first, second = (stored_1, str(actual_1)), (stored_2, str(actual_2))
    assert held(first, second) == (stored_1 == stored_2 and actual_1 == actual_2)
    assert not held(None, second)


def test_a_null_revision_reads_as_the_stream_shows_it() -> None:
    """A read shows a NULL revision as NULL, a stream image as None: one state, so a look
    sent from the stream is not taken for a parent that moved."""
    from tally.core.numbers import NULL

    assert state_of(True, Decimal(3), NULL) == state_of(True, Decimal(3), None)
    assert state_of(True, Decimal(3), None) != state_of(True, Decimal(3), Decimal(1))
    assert state_of(False, None, None) != state_of(True, None, None)
