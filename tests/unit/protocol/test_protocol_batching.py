"""The protocol's batching: how a batch's work is laid out: which groups share an item
collection (and so run in order, in one worker), and how much of the carry's window is
left when its recheck is scheduled."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.protocol.batching import MIN_CARRY_DELAY, item_collections, window_left


@dataclass(frozen=True)
class Group:
    parent_key: dict[str, str]


keys = st.tuples(st.sampled_from(["POST#a", "POST#b", "POST#c", "ORDER#1"]), st.text(max_size=3))


@settings(max_examples=1000, deadline=None)
@given(st.lists(keys, unique=True, max_size=30))
def test_every_group_lands_in_the_collection_of_its_partition_key_in_batch_order(
    parents: list[tuple[str, str]],
) -> None:
    groups = [Group({"PK": pk, "SK": sk}) for pk, sk in parents]
    collections = item_collections(groups, "PK")
    assert sorted(map(id, (g for c in collections for g in c))) == sorted(map(id, groups))
    for collection in collections:
        assert len({g.parent_key["PK"] for g in collection}) == 1
        positions = [groups.index(g) for g in collection]
        assert positions == sorted(positions)
    heads = [c[0].parent_key["PK"] for c in collections]
    assert len(heads) == len(set(heads))
    assert heads == list(dict.fromkeys(pk for pk, _ in parents))


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
