"""Step 1's decisions: a batch balances exactly when its writes cancel out, against brute
force over any numbers handed out and inserted, and over exact sums of any amounts."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.numbers import add, exact_sum, representable
from tally.reconciler.protocol.balance import counts_balance, numbers_balance

ranges = st.lists(
    st.tuples(st.integers(1, 40), st.integers(0, 5)).map(lambda r: (r[0], r[0] + r[1])),
    max_size=6,
)
inserts = st.lists(st.integers(0, 50), max_size=25).map(Counter)


@settings(max_examples=1000, deadline=None)
@given(ranges, inserts)
def test_numbers_balance_exactly_when_each_handed_out_number_has_one_insert(
    handed_out: list[tuple[int, int]], inserted: Counter[int]
) -> None:
    handed = Counter(n for low, high in handed_out for n in range(low, high + 1))
    assert numbers_balance(handed_out, inserted) == (
        handed == inserted and max(handed.values(), default=1) == 1
    )


@settings(max_examples=1000, deadline=None)
@given(ranges)
def test_the_members_of_the_numbers_handed_out_balance_in_any_order(
    handed_out: list[tuple[int, int]],
) -> None:
    numbers = [n for low, high in handed_out for n in range(low, high + 1)]
    if len(numbers) != len(set(numbers)):  # one number handed out twice: never balanced
        assert not numbers_balance(handed_out, Counter(numbers))
        return
    assert numbers_balance(list(reversed(handed_out)), Counter(numbers))
    if numbers:  # one insert missing, or one more: unbalanced
        assert not numbers_balance(handed_out, Counter(numbers[1:]))
        assert not numbers_balance(handed_out, Counter([*numbers, max(numbers) + 1]))


amounts = st.decimals(min_value=Decimal("-1E+20"), max_value=Decimal("1E+20"), places=10)


@settings(max_examples=1000, deadline=None)
@given(st.lists(amounts, max_size=12))
def test_a_counter_moved_by_its_childrens_exact_sum_balances_and_one_digit_off_does_not(
    children: list[Decimal],
) -> None:
    total = exact_sum(children)
    if not representable(total):
        return
    assert counts_balance(total, total)
    assert counts_balance(exact_sum(reversed(children)), total)
    off = add(total, Decimal("1E-10"))  # exact: the default context would round it away
    assert not counts_balance(off, total)
