"""Step 2's judgement over every value a parent and its children can hold."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.numbers import representable
from tally.reconciler.protocol.judgement import (
    ChildTotal,
    ParentState,
    drifted,
    judge,
    valid_counter,
)
from tally.reconciler.protocol.repair import never_repaired
from tally.rules import load_rules
from tests.integration.conftest import RULES_FILE

RULES = load_rules(RULES_FILE)
LIKES, TOTAL = RULES["likes"], RULES["order-total"]

numbers = st.one_of(
    st.integers(-3, 30).map(Decimal),
    st.decimals(min_value=-100, max_value=100, places=2, allow_nan=False),
    st.sampled_from([Decimal("9.99E+125"), Decimal("1E-130"), Decimal("1E+38")]),
)
values = st.one_of(st.none(), numbers, st.text(max_size=3), st.booleans(), st.just(Decimal("NaN")))
parents = st.builds(ParentState, st.booleans(), values, values)
tallies = st.builds(
    ChildTotal,
    st.one_of(numbers, st.just(Decimal("1E+200"))),
    st.integers(0, 30),
)


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from([LIKES, TOTAL]), parents, tallies, st.booleans())
def test_a_verdict_is_given_exactly_when_the_parent_is_off_and_names_what_is_off(
    rule: Any, parent: ParentState, tally: ChildTotal, ttl: bool
) -> None:
    verdict = judge(rule, parent, tally, ttl_removed=ttl)
    assert drifted(rule, parent, tally) == (verdict is not None)
    stored = parent.counter if parent.counter is not None else Decimal(0)
    if not parent.exists:
        assert (verdict is None) == (tally.children == 0)
        if verdict is not None:
            assert verdict.kind == "orphans" and verdict.actual == tally.children
        return
    if not valid_counter(rule, parent.counter):
        assert verdict is not None and verdict.kind == "invalid_counter"
        assert verdict.attribute == rule.counter
        return
    if stored == tally.actual:
        assert verdict is None
        return
    assert verdict is not None
    if verdict.kind == "invalid_counter":  # the revision a repair would bump
        assert verdict.attribute == rule.revision and verdict.stored is parent.revision
    elif verdict.kind == "unrepresentable":
        assert not representable(tally.actual) and verdict.actual == str(tally.actual)
    else:
        assert verdict.kind == ("ttl_removal" if ttl else "drift")
        assert verdict.stored == parent.counter and verdict.actual == tally.actual
        assert not never_repaired(rule, verdict.kind, verdict.attribute, parent.revision)


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from([LIKES, TOTAL]), parents, tallies)
def test_what_is_never_repaired_is_never_a_write_over_a_value_not_judged(
    rule: Any, parent: ParentState, tally: ChildTotal
) -> None:
    verdict = judge(rule, parent, tally)
    if verdict is None or verdict.kind == "orphans":
        return
    why = never_repaired(rule, verdict.kind, verdict.attribute, parent.revision)
    if verdict.kind in ("invalid_counter", "unrepresentable"):
        assert why
    if why == "":  # a repair may write: over a number, with a revision it can bump
        assert valid_counter(rule, parent.counter) and representable(verdict.actual)


def test_a_count_of_two_and_a_half_is_an_invalid_counter_a_sum_of_it_is_not() -> None:
    half = ParentState(True, Decimal("2.5"), Decimal(1))
    count = judge(LIKES, half, ChildTotal(Decimal(2), 2))
    assert count is not None and count.kind == "invalid_counter"
    assert count.details == ("counter 2.5 is not an integer",)
    total = judge(TOTAL, half, ChildTotal(Decimal(2), 2))
    assert total is not None and total.kind == "drift"
