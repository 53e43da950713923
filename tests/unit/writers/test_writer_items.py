"""The writers' request checks in plain Python: numbers, sizes, reserved names, fingerprints."""

from __future__ import annotations

from decimal import Context, Decimal, Inexact, Rounded
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.dynamodb import Backoff
from tally.rules import SumRule, load_rules, parse_rules
from tally.writers import InvalidRequestError
from tally.writers import items as limits
from tally.writers.idempotency import Guards, fingerprint
from tally.writers.reserved import reserved_attributes
from tally.writers.tallies import in_domain

RULES_FILE = Path(__file__).parents[2] / "integration" / "rules.toml"


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        (Decimal("12.50"), Decimal("12.5")),
        (Decimal("-0.000"), Decimal("0")),
        (10**37 * 9, Decimal("9E+37")),
        (Decimal("0.00100"), Decimal("0.001")),
        (Decimal("1E-130"), Decimal("1E-130")),
        (7, Decimal("7")),
    ],
)
def test_numbers_are_stored_as_dynamodb_keeps_them(value: Any, canonical: Decimal) -> None:
    number = limits.number(value, ("x",))
    assert number == canonical
    assert number.as_tuple() == canonical.as_tuple()


@pytest.mark.parametrize(
    "value",
    [
        *(Decimal(text) for text in ("NaN", "Infinity", "1E+38", "1E-131", "1." + "1" * 38)),
        *(10**38 + 1, 0.5, True, "1", None),
    ],
)
def test_numbers_dynamodb_or_its_readers_cannot_hold_are_refused(value: Any) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        limits.number(value, ("attributes", "x"))
    assert raised.value.field == ("attributes", "x")


@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_a_canonical_number_equals_the_input_or_is_refused(value: Decimal) -> None:
    try:
        number = limits.number(value, ("x",))
    except InvalidRequestError:
        return
    assert number == value
    assert len(number.as_tuple().digits) <= limits.MAX_DIGITS


@pytest.mark.parametrize(
    ("item", "size"),
    [
        ({"a": "é"}, 1 + 2),
        ({"n": Decimal("-123")}, 1 + 4),
        ({"n": Decimal("1.5")}, 1 + 3),  # digits pair up around the decimal point
        ({"n": Decimal("1E+30")}, 1 + 2),
        ({"l": ["a", "a"]}, 1 + 3 + 2 * 2),
        ({"m": {"k": "a"}}, 1 + 3 + 1 + 1 + 1),
        ({"s": {"a", "bb"}}, 1 + 3),
        ({"b": True, "z": None}, 2 + 2),
    ],
)
def test_item_sizes_follow_dynamodbs_rules(item: dict[str, Any], size: int) -> None:
    assert limits.item_size(item) == size


def test_nesting_stops_at_32_levels() -> None:
    value: Any = "leaf"
    for _ in range(limits.MAX_CONTAINERS):
        value = {"k": value}
    limits.attributes({"deep": value}, ("attributes",))
    with pytest.raises(InvalidRequestError, match="32 levels"):
        limits.attributes({"deep": [value]}, ("attributes",))


def test_reserved_attributes_follow_the_rules() -> None:
    rules = load_rules(RULES_FILE)
    likes = reserved_attributes(rules, rules["likes"])
    sessions = reserved_attributes(rules, rules["sessions"])
    issues = reserved_attributes(rules, rules["issue-numbers"])
    assert {"PK", "SK", "likeTally", "tallyRevision", "tallyRepair", "expiresAt"} <= set(likes)
    assert {"seqName", "NumIdentifier"} <= set(likes)  # a like must not join the user index
    assert "expiresAt" not in sessions  # its rule counts an expiry as a removal
    assert {"lastIssue", "expiresAt", "seqName"} <= set(issues)
    assert "amount" not in reserved_attributes(rules, rules["order-total"])


def test_a_rule_claiming_the_guard_keys_is_refused() -> None:
    rules = parse_rules(
        {
            "rules": [
                {
                    "name": "everything",
                    "kind": "count",
                    "parent": {"PK": "*", "SK": "tallyIdempotency"},
                    "children": {"SK": "X#*"},
                    "counter": "n",
                }
            ]
        }
    )
    with pytest.raises(ValueError, match="reserved"):
        Guards(None, "table", rules, Backoff())


def test_fingerprints_tell_types_apart_and_ignore_set_order() -> None:
    assert fingerprint("add", {"a": "5"}) != fingerprint("add", {"a": Decimal(5)})
    assert fingerprint("add", {"a": Decimal(5)}) == fingerprint("add", {"a": 5})
    assert fingerprint("add", {"s": {"x", "y", "z"}}) == fingerprint("add", {"s": {"z", "y", "x"}})
    assert fingerprint("add", {"k": 1}) != fingerprint("remove", {"k": 1})


def test_the_bundled_rules_name_the_templates_ttl_attribute(template: dict[str, Any]) -> None:
    declared = template["Resources"]["Table"]["Properties"]["TimeToLiveSpecification"]
    assert load_rules().table.ttl_attribute == declared["AttributeName"]


# --- a sum rule's amount domain -----------------------------------------------------------

# Numbers from DynamoDB's whole domain: 1 to 38 significant digits, leading digit at 10**-130
# up to 10**125.
domain_numbers = st.builds(
    lambda sign, digits, adjusted: Decimal((sign, tuple(digits), adjusted - len(digits) + 1)),
    st.integers(0, 1),
    st.lists(st.integers(0, 9), min_size=1, max_size=38).filter(lambda d: d[0] != 0),
    st.integers(-130, 125),
)


@given(domain_numbers)
def test_an_amount_is_accepted_exactly_when_it_is_in_the_rule_domain(value: Decimal) -> None:
    rule = load_rules(RULES_FILE)["order-total"]
    assert isinstance(rule, SumRule)
    exact = Context(prec=400)
    inside = value == value.quantize(Decimal("0.01"), context=exact) and value.copy_abs() <= 10**15
    try:
        accepted = in_domain(value, rule, ("attributes", "amount"))
    except InvalidRequestError as error:
        assert not inside, value
        assert error.field == ("attributes", "amount")
        assert "amount domain" in str(error) or value.copy_abs() >= Decimal("1E+38")
    else:
        assert inside and accepted == value, value


@given(st.lists(st.decimals(min_value=-(10**15), max_value=10**15, places=2), min_size=1))
def test_any_sum_of_accepted_amounts_is_exact_in_38_digits(amounts: list[Decimal]) -> None:
    exact = Context(prec=38, traps=[Inexact, Rounded])
    total = Decimal(0)
    for amount in amounts:
        total = exact.add(total, amount)  # raises if DynamoDB's ADD could not be exact
    # The bound behind it: N amounts of at most 1E+15 with 2 places need 18 + log10(N) digits.
    assert total.copy_abs() <= len(amounts) * Decimal("1E+15")


def _sum_rules(**domain: Any) -> dict[str, Any]:
    rule = {
        "name": "order-total",
        "kind": "sum",
        "parent": {"PK": "ORDER#*", "SK": "META"},
        "children": {"SK": "LINE#*"},
        "counter": "total",
        "summed": "amount",
        **domain,
    }
    return {"table": {"partition_key": "PK", "sort_key": "SK"}, "rules": [rule]}


@pytest.mark.parametrize(
    ("domain", "scale", "maximum"),
    [
        ({}, 2, Decimal("1E+15")),
        ({"scale": 6, "max_amount": 10**12}, 6, Decimal("1E+12")),
        ({"scale": 0, "max_amount": "9" * 38}, 0, Decimal("9" * 38)),
        ({"max_amount": "12.50"}, 2, Decimal("12.5")),
    ],
)
def test_a_sum_rule_states_its_amount_domain(domain: Any, scale: int, maximum: Decimal) -> None:
    rule = parse_rules(_sum_rules(**domain))["order-total"]
    assert isinstance(rule, SumRule)
    assert (rule.scale, rule.max_amount) == (scale, maximum)


@pytest.mark.parametrize(
    ("domain", "says"),
    [
        ({"scale": 2, "max_amount": "1E+36"}, "needs 39 digits"),
        ({"max_amount": "0.001"}, "more decimal places than scale"),
        ({"max_amount": 0}, "positive"),
        ({"max_amount": "-5"}, "positive"),
        ({"scale": -1}, "scale"),
        ({"scale": 38}, "scale"),
        ({"max_amount": "NaN"}, "max_amount"),
    ],
)
def test_an_amount_domain_no_amount_fits_is_refused_naming_the_rule(domain: Any, says: str) -> None:
    with pytest.raises(ValueError, match="order-total") as error:
        parse_rules(_sum_rules(**domain))
    assert says in str(error.value)
