"""Looks at aggregated counters on their way: a change seen before one comes due needs no look
of its own, and no change seen later is ever taken as covered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tally.reconciler.report import scheduling
from tally.reconciler.report.scheduling import COVER_MARGIN_SECONDS, PendingLooks, covers

PARENTS = [
    ("t1", "totals", {"pk": "product#a"}),
    ("t1", "totals", {"pk": "product#b"}),
    ("t2", "totals", {"pk": "product#a"}),
    ("t1", "other", {"pk": "product#a"}),
]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("wait"), st.floats(0, 10, allow_nan=False)),
        st.tuples(st.just("send"), st.integers(0, len(PARENTS) - 1), st.integers(0, 900)),
        st.tuples(st.just("ask"), st.integers(0, len(PARENTS) - 1)),
    ),
    max_size=60,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@given(steps)
def test_a_parent_is_covered_exactly_while_the_last_look_sent_to_it_cannot_have_begun(
    run: list[tuple],
) -> None:
    clock = Clock()
    looks = PendingLooks(clock)
    due: dict[int, float] = {}  # the model: each parent's last look, when it comes due
    for step in run:
        if step[0] == "wait":
            clock.now += step[1]
        elif step[0] == "send":
            looks.sent(*PARENTS[step[1]], step[2])
            due[step[1]] = clock.now + step[2]
        else:
            expected = step[1] in due and due[step[1]] - COVER_MARGIN_SECONDS > clock.now
            assert looks.covering(*PARENTS[step[1]]) is expected


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), max_size=80), st.integers(1, 8))
def test_a_container_that_forgets_only_sends_more_looks_never_fewer(
    sends: list[tuple[int, int]], room: int
) -> None:
    clock = Clock()
    looks = PendingLooks(clock)
    sent_at: dict[int, float] = {}
    original = scheduling.MAX_PENDING_LOOKS
    scheduling.MAX_PENDING_LOOKS = room
    try:
        for parent, delay in sends:
            looks.sent("t", "r", {"pk": str(parent)}, delay)
            sent_at[parent] = clock.now + delay
            clock.now += 0.5
            for other in range(51):
                if looks.covering("t", "r", {"pk": str(other)}):
                    assert other in sent_at and covers(sent_at[other], clock.now)
    finally:
        scheduling.MAX_PENDING_LOOKS = original


@given(st.floats(0, 2e9, allow_nan=False), st.floats(0, 2e9, allow_nan=False))
def test_no_look_covers_a_change_seen_within_the_margin_of_its_due_time(due: float, now: float):
    assert covers(due, now) is (now < due - COVER_MARGIN_SECONDS)
    assert not covers(None, now)
