"""A counter split per Region, as values: its total is the parent's base plus every shard's,
exactly; a repair through the home Region's shard makes that total the truth, and leaves
every other part as it was (docs/global-tables.md, "Counters split per Region")."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from tally.core.numbers import NULL
from tally.reconciler.protocol import shards
from tally.reconciler.protocol.judgement import ChildTotal, ParentState, judge
from tally.rules import CountRule, SumRule

REGIONS = ("ap-southeast-2", "eu-west-1", "us-east-1")
COUNT = CountRule(name="likes", kind="count", parent={"PK": "P#*", "SK": "META"},
                  children={"SK": "C#*"}, counter="n", split="region")  # fmt: skip
SUM = SumRule(name="total", kind="sum", parent={"PK": "O#*", "SK": "META"},
              children={"SK": "L#*"}, counter="t", summed="a", split="region")  # fmt: skip

whole = st.integers(min_value=-(10**12), max_value=10**12).map(Decimal)
amounts = st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False)
parts = st.one_of(st.none(), whole, amounts)


@st.composite
def split_states(draw: st.DrawFn) -> tuple[object, shards.Shards]:
    base = draw(parts)
    regions = draw(st.lists(st.sampled_from(REGIONS), unique=True).map(sorted))
    return base, tuple((region, draw(parts)) for region in regions)


@given(split_states())
def test_the_total_is_the_base_and_every_shard_exactly(state: tuple[object, shards.Shards]) -> None:
    base, held = state
    expected = sum((v for v in (base, *(v for _, v in held)) if v is not None), Decimal(0))
    assert shards.total(base, held) == expected


@given(split_states(), st.sampled_from(REGIONS), amounts)
def test_a_repair_through_the_home_shard_makes_the_total_the_truth_and_no_other_part_moves(
    state: tuple[object, shards.Shards], home: str, truth: Decimal
) -> None:
    base, held = state
    stored = shards.total(base, held)
    assert isinstance(stored, Decimal)
    after = shards.home_after(dict(held).get(home), stored, truth)
    assert after is not None
    repaired = {**dict(held), home: after}
    assert shards.total(base, tuple(sorted(repaired.items()))) == truth
    assert {r: v for r, v in repaired.items() if r != home} == {r: v for r, v in held if r != home}


@given(split_states(), st.integers(min_value=0, max_value=10**6))
def test_a_split_count_drifts_exactly_when_its_total_is_not_its_children(
    state: tuple[object, shards.Shards], children: int
) -> None:
    base, held = state
    total = shards.total(base, held)
    parent = ParentState(True, total, None, base=base, shards=held)
    verdict = judge(COUNT, parent, ChildTotal(Decimal(children), children))
    whole_total = total == total.to_integral_value() and total >= 0
    if not whole_total:
        assert verdict is not None and verdict.kind == "invalid_counter"
    elif total == children:
        assert verdict is None
    else:
        assert verdict is not None and (verdict.kind, verdict.stored) == ("drift", total)


@given(split_states(), amounts)
def test_a_split_sum_drifts_exactly_when_its_total_is_not_its_amounts(
    state: tuple[object, shards.Shards], truth: Decimal
) -> None:
    base, held = state
    total = shards.total(base, held)
    verdict = judge(SUM, ParentState(True, total, None, base=base, shards=held),
                    ChildTotal(truth, 1))  # fmt: skip
    assert (verdict is None) == (total == truth)


@given(split_states(), st.sampled_from(REGIONS), st.sampled_from(["7", NULL, True, b"x"]))
def test_a_part_holding_no_number_makes_the_counter_invalid_never_zero(
    state: tuple[object, shards.Shards], region: str, bad: object
) -> None:
    base, held = state
    broken = tuple(sorted({**dict(held), region: bad}.items()))
    total = shards.total(base, broken)
    assert total is bad
    verdict = judge(COUNT, ParentState(True, total, None, base=base, shards=broken),
                    ChildTotal(Decimal(0), 0))  # fmt: skip
    assert verdict is not None and verdict.kind == "invalid_counter"


def test_the_parts_are_named_in_a_findings_detail() -> None:
    held = (("eu-west-1", Decimal(17)), ("us-east-1", None))
    assert shards.described(Decimal(0), held) == (
        "split per Region: base 0; shards eu-west-1: 17, us-east-1: absent"
    )


def test_two_states_with_the_same_total_but_other_shards_are_not_the_same_state() -> None:
    a = ParentState(
        True, Decimal(2), None, base=None, shards=(("eu", Decimal(1)), ("us", Decimal(1)))
    )
    b = ParentState(
        True, Decimal(2), None, base=None, shards=(("eu", Decimal(2)), ("us", Decimal(0)))
    )
    assert not a.same_as(b) and a != b
