"""The harness's lagging index schedule (tests/harness/index_lag.py): a wrong emulation
would make the live index test meaningless, so its promises are tested here."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.harness.index_lag import Change, LagSchedule, item_key, shadow_table_kwargs

LAG, JITTER = 1.5, 0.3


def keys(n: int) -> dict[str, Any]:
    return {"pk": {"S": f"USER#{n}"}, "sk": {"S": "FOLLOWS#0"}}


def image(n: int, parent: str) -> dict[str, Any]:
    return {**keys(n), "GSI1PK": {"S": parent}, "GSI1SK": {"S": "FOLLOWING#1"}}


# A stream: (item, new parent or None for a removal, seconds since the previous record).
streams = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.one_of(st.none(), st.sampled_from(["USER#a", "USER#b"])),
        st.floats(0, 2, allow_nan=False),
    ),
    max_size=40,
)


def observed(schedule: LagSchedule, stream: list[tuple[int, str | None, float]]) -> list[Change]:
    changes, seen = [], 100.0
    for sequence, (n, parent, gap) in enumerate(stream):
        seen += gap
        change = schedule.observe(keys(n), parent and image(n, parent), sequence, seen)
        assert change is not None
        changes.append(change)
    return changes


@given(streams, st.integers(0, 1000))
def test_every_change_is_due_a_lag_after_it_was_seen_within_the_jitter(
    stream: list[tuple[int, str | None, float]], seed: int
) -> None:
    for change in observed(LagSchedule(LAG, JITTER, seed), stream):
        assert change.seen + LAG - JITTER <= change.due <= change.seen + LAG + JITTER + 1e-9


@given(streams, st.integers(0, 1000), st.lists(st.floats(95, 160), max_size=12))
def test_the_index_at_any_time_is_each_items_last_change_due_by_then(
    stream: list[tuple[int, str | None, float]], seed: int, times: list[float]
) -> None:
    """Applying what is due, at times in order, leaves each item as its last change (in
    stream order) whose due time has passed: never a newer one, never an older one."""
    schedule = LagSchedule(LAG, JITTER, seed)
    changes = observed(schedule, stream)
    index: dict[Any, dict[str, Any] | None] = {}
    for now in sorted(times):
        for change in schedule.due(now):
            index[change.key] = change.image
        for key in {c.key for c in changes}:
            passed = [c for c in changes if c.key == key and c.due <= now]
            expected = passed[-1].image if passed else None
            assert index.get(key) == expected
            # Never ahead of the table: what it shows was seen at least a lag less the
            # jitter before now.
            if passed:
                assert passed[-1].seen <= now - (LAG - JITTER) + 1e-9
    # In the end it is the table: every item's last image.
    for change in schedule.everything():
        index[change.key] = change.image
    last = {c.key: c.image for c in changes}
    assert {k: v for k, v in index.items() if k in last} == last
    assert schedule.pending == 0


def test_an_edge_that_joined_is_hidden_and_one_that_left_is_shown_until_the_lag() -> None:
    schedule = LagSchedule(LAG, 0.0)
    schedule.observe(keys(1), image(1, "USER#a"), 1, seen=10.0)
    schedule.everything()  # the index has it under USER#a
    schedule.observe(keys(1), image(1, "USER#b"), 2, seen=20.0)  # re-parented
    assert schedule.due(21.0) == []  # still under USER#a, not yet under USER#b
    (change,) = schedule.due(21.5)
    assert change.image == image(1, "USER#b")


def test_a_redelivered_or_older_record_is_ignored() -> None:
    schedule = LagSchedule(LAG, JITTER, 1)
    assert schedule.observe(keys(1), image(1, "USER#a"), 5, seen=1.0) is not None
    assert schedule.observe(keys(1), image(1, "USER#a"), 5, seen=2.0) is None
    assert schedule.observe(keys(1), None, 4, seen=2.0) is None
    assert schedule.pending == 1
    # Another item's older sequence number is its own business.
    assert schedule.observe(keys(2), None, 3, seen=2.0) is not None


def test_a_later_change_of_the_same_item_is_never_applied_before_an_earlier_one() -> None:
    schedule = LagSchedule(1.0, 1.0, 0)
    first = schedule.observe(keys(1), image(1, "USER#a"), 1, seen=0.0)
    second = schedule.observe(keys(1), None, 2, seen=0.0)
    assert first is not None and second is not None
    assert second.due >= first.due
    assert [c.sequence for c in schedule.everything()] == [1, 2]


@pytest.mark.parametrize("lag, jitter", [(-1.0, 0.0), (1.0, -0.1), (1.0, 1.5)])
def test_a_lag_below_its_jitter_is_refused(lag: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        LagSchedule(lag, jitter)


def test_item_keys_ignore_attribute_order() -> None:
    assert item_key({"sk": {"S": "x"}, "pk": {"N": "1"}}) == (("pk", "1"), ("sk", "x"))


def test_the_shadow_copies_keys_and_global_indexes_only() -> None:
    description = {
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": "GSI1",
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
                "IndexStatus": "ACTIVE",
            }
        ],
        "StreamSpecification": {"StreamEnabled": True},
    }
    kwargs = shadow_table_kwargs(description, "shadow")
    assert "StreamSpecification" not in kwargs
    assert kwargs["GlobalSecondaryIndexes"] == [
        {
            "IndexName": "GSI1",
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
    ]
