"""The carry's fold, as a function of values: any batching of a stream, with any
redelivery, folds every record's share exactly once."""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.protocol.carry import MIN_CARRY_DELAY, Carry, fold, take_off, window_left

shares = st.lists(st.integers(-3, 3).map(Decimal), min_size=1, max_size=40)


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[Decimal], list[list[int]]]:
    """A stream of shares, cut into batches anywhere, each batch possibly delivered again
    (whole, or from a record on, as a retry from a failed record does) after later ones."""
    stream = draw(shares)
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=len(stream) - 1)))
    bounds = [0, *cuts, len(stream)]
    batches = [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    delivered: list[list[int]] = []
    for batch in batches:
        delivered.append(batch)
        if draw(st.booleans()):  # a redelivery of something already folded
            earlier = draw(st.sampled_from(delivered))
            start = draw(st.integers(0, len(earlier) - 1))
            delivered.append(earlier[start:])
    return stream, delivered


@settings(max_examples=1000, deadline=None)
@given(deliveries())
def test_any_batching_with_any_redelivery_folds_each_record_once(
    case: tuple[list[Decimal], list[list[int]]],
) -> None:
    stream, delivered = case
    carry = Carry()
    for now, batch in enumerate(delivered, start=1):
        through = max(batch)
        folded = fold(carry, through, [(str(n), stream[n]) for n in batch], now)
        if through <= carry.through:
            assert folded.outcome == "folded before" and folded.carry is None
            continue
        assert folded.carry is not None
        new = folded.carry
        added = sum((stream[n] for n in batch if n > carry.through), Decimal(0))
        assert new.remainder == carry.remainder + added
        assert new.through == through
        if not new.remainder:
            assert folded.outcome == "balanced" and new.since == 0
        elif folded.outcome == "continued":
            assert carry.remainder and new.since == carry.since  # the same window
        else:
            assert folded.outcome == "opened" and new.since == now  # a window of its own
        carry = new
    assert carry.remainder == sum(stream, Decimal(0))
    assert carry.through == len(stream) - 1


@settings(max_examples=1000, deadline=None)
@given(st.integers(-5, 5), st.lists(st.integers(-3, 3), min_size=1, max_size=10))
def test_a_remainder_continues_only_while_it_never_returns_to_zero(
    before: int, deltas: list[int]
) -> None:
    previous = Carry(Decimal(before), 0, 7 if before else 0)
    folded = fold(
        previous, len(deltas), [(str(n + 1), Decimal(d)) for n, d in enumerate(deltas)], 9
    )
    running = [before + sum(deltas[: i + 1]) for i in range(len(deltas))]
    if running[-1] == 0:
        assert folded.outcome == "balanced"
    elif before and all(running):
        assert folded.outcome == "continued"
    else:
        assert folded.outcome == "opened"


def test_a_remainder_past_the_domain_is_recounted_not_carried() -> None:
    folded = fold(Carry(Decimal("9E+125"), 0, 1), 1, [("1", Decimal("9E+125"))], 2)
    assert folded.outcome == "too large" and folded.carry is None


@settings(max_examples=1000, deadline=None)
@given(st.integers(-9, 9), st.integers(-9, 9), st.integers(0, 50), st.integers(0, 50))
def test_a_recount_takes_off_what_it_covered_and_the_rest_keeps_a_window_of_its_own(
    seen: int, since_then: int, seen_through: int, more: int
) -> None:
    read = Carry(Decimal(seen), seen_through, 5, "t0")
    now = Carry(Decimal(seen + since_then), seen_through + more, 5, "t0")
    after = take_off(read, now, 11)
    assert after is not None
    assert after.remainder == since_then and after.through == now.through
    assert after.since == (11 if since_then else 0)


# --- how much of the window is left when the recheck is scheduled ---------------------

times = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.datetimes(timezones=st.just(UTC)),
    st.none(),
    st.text(max_size=5),
    st.booleans(),
)


@settings(max_examples=2000, deadline=None)
@given(times, st.floats(min_value=0, max_value=4e9), st.integers(min_value=0, max_value=900))
def test_the_window_left_is_bounded_and_never_cut_by_more_than_the_records_age(
    first_at: object, now: float, window: int
) -> None:
    left = window_left(first_at, now, window)
    assert isinstance(left, int)
    if window <= MIN_CARRY_DELAY:
        assert left == window
        return
    assert MIN_CARRY_DELAY <= left <= window
    if isinstance(first_at, datetime):
        began = first_at.timestamp() + 1
    elif isinstance(first_at, int | float | Decimal) and not isinstance(first_at, bool):
        began = float(first_at) + 1
    else:
        assert left == window  # no stream time: the whole window
        return
    if not (math.isfinite(began) and began <= now):
        assert left == window  # no time, or a stream clock ahead of ours: cuts nothing
        return
    age = now - began
    # Whole seconds: the wait plus the records' age covers the window (never shorter),
    # unless the floor of MIN_CARRY_DELAY or the window itself bounds it.
    assert left == max(MIN_CARRY_DELAY, min(window, math.ceil(window - age)))
    assert left + age >= window or left == MIN_CARRY_DELAY


def test_a_record_read_at_once_waits_the_whole_window_and_a_late_one_less() -> None:
    written = 1_795_000_000  # stream time, whole seconds
    assert window_left(written, written + 0.4, 5) == 5
    assert window_left(written, written + 3.5, 5) == 3
    assert window_left(written, written + 60, 5) == MIN_CARRY_DELAY
    assert window_left(Decimal(written), written + 3.5, 5) == 3
    assert window_left(datetime.fromtimestamp(written, UTC), written + 3.5, 5) == 3
