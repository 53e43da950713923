"""The writers' pure decisions for children found through an index (tally.writers.indexed,
and the fence of tally.writers.fenced)."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.rules import CountRule, SumRule, parse_rules
from tally.writers import InvalidRequestError
from tally.writers.fenced import fence, fenced_writes
from tally.writers.indexed import (
    check_index_keys,
    index_values,
    leaves_deliberately,
    moves,
    named_parent,
    refused_index_key,
)
from tally.writers.transactions import read_item
from tests.harness.index_tables import CART_TOTALS
from tests.harness.index_tables import FOLLOWERS as FOLLOWERS_RULE

RULES = parse_rules(
    {
        "rules": [
            FOLLOWERS_RULE,
            CART_TOTALS,
        ]
    }
)
FOLLOWERS, CARTS = RULES["followers"], RULES["cart-totals"]
assert isinstance(FOLLOWERS, CountRule) and isinstance(CARTS, SumRule)
KEYS = RULES.table
BASE = ("attributes",)
BOB = {"PK": "USER#bob", "SK": "PROFILE"}


def test_an_edge_names_its_followee_and_a_cart_line_its_product_by_its_own_key() -> None:
    edge = {"PK": "USER#ann", "SK": "FOLLOWS#x", "GSI1PK": "USER#bob", "GSI1SK": "FOLLOWING#1"}
    assert named_parent(FOLLOWERS, edge, KEYS, BASE) == BOB
    line = {"PK": "BASKET#1", "SK": "SKU#a", "qty": Decimal(2)}
    assert named_parent(CARTS, line, KEYS, BASE) == {"PK": "SKU#a", "SK": "ALLCARTS"}


@pytest.mark.parametrize(
    ("image", "field", "words"),
    [
        ({}, ("attributes", "GSI1PK"), "is missing"),
        ({"GSI1PK": 7, "GSI1SK": "FOLLOWING#1"}, ("attributes", "GSI1PK"), "non-empty string"),
        ({"GSI1PK": "USER#bob"}, ("attributes", "GSI1SK"), "'FOLLOWING#'"),
        ({"GSI1PK": "USER#bob", "GSI1SK": "MUTED#"}, ("attributes", "GSI1SK"), "counted"),
        ({"GSI1PK": "TEAM#x", "GSI1SK": "FOLLOWING#"}, ("attributes", "GSI1PK"), "'USER#*'"),
        (
            {"GSI1PK": "USER#" + "é" * 1022, "GSI1SK": "FOLLOWING#"},
            ("attributes", "GSI1PK"),
            "2049",
        ),
    ],
)
def test_an_image_naming_no_parent_is_refused_on_the_index_attribute_at_fault(
    image: dict[str, Any], field: tuple[str, ...], words: str
) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        named_parent(FOLLOWERS, {"PK": "USER#ann", "SK": "FOLLOWS#x", **image}, KEYS, BASE)
    assert refused.value.field == field
    assert words in str(refused.value)


def test_a_cart_line_naming_no_product_is_refused_on_its_key() -> None:
    with pytest.raises(InvalidRequestError) as refused:
        named_parent(CARTS, {"PK": "BASKET#1", "SK": "GIFT#a"}, KEYS, BASE)
    assert refused.value.field == ("key", "SK")


@given(
    named=st.one_of(st.none(), st.integers(), st.text(max_size=8)),
    status=st.one_of(st.none(), st.text(max_size=12)),
    prefix=st.sampled_from(["USER#", "TEAM#", ""]),
)
def test_a_parent_is_named_exactly_when_the_rules_say_so_else_an_index_field_is(
    named: Any, status: Any, prefix: str
) -> None:
    image: dict[str, Any] = {"PK": "USER#ann", "SK": "FOLLOWS#x"}
    if named is not None:
        image["GSI1PK"] = prefix + named if isinstance(named, str) else Decimal(named)
    if status is not None:
        image["GSI1SK"] = status
    expected = FOLLOWERS.indexed_parent(image, KEYS)
    try:
        parent = named_parent(FOLLOWERS, image, KEYS, BASE)
    except InvalidRequestError as refused:
        assert expected is None
        assert refused.field in (("attributes", "GSI1PK"), ("attributes", "GSI1SK"))
        # A refusal names the status only when the followee is fine.
        if refused.field[-1] == "GSI1SK":
            assert isinstance(image.get("GSI1PK"), str) and image["GSI1PK"]
        # On purpose or a mistake: a move may leave the count only by status or sparseness.
        deliberate = "GSI1PK" not in image or refused.field[-1] == "GSI1SK"
        assert leaves_deliberately(FOLLOWERS, image) == deliberate
    else:
        assert parent == expected


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (BOB, BOB, []),
        (None, None, []),
        (BOB, None, [(BOB, Decimal(-3))]),
        (None, BOB, [(BOB, Decimal(3))]),
        (BOB, {"PK": "USER#cat"}, [(BOB, Decimal(-3)), ({"PK": "USER#cat"}, Decimal(3))]),
    ],
)
def test_a_move_is_minus_the_amount_on_the_old_parent_and_plus_on_the_new(
    old: Any, new: Any, expected: list[Any]
) -> None:
    assert moves(old, new, Decimal(3)) == expected


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({}, ("attributes",)),
        ({"nickname": "x"}, ("attributes", "nickname")),
        ({"PK": "USER#x"}, ("attributes", "PK")),
        ({"GSI1PK": ""}, ("attributes", "GSI1PK")),
        ({"GSI1SK": True}, ("attributes", "GSI1SK")),
        ({"GSI1SK": 1.5}, ("attributes", "GSI1SK")),
        ({"GSI1SK": ["FOLLOWING#"]}, ("attributes", "GSI1SK")),
    ],
)
def test_a_move_sets_only_the_index_keys_a_child_may_move_by(
    values: dict[str, Any], field: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        index_values(FOLLOWERS, KEYS, values, BASE)
    assert refused.value.field == field


def test_a_move_of_a_line_whose_index_is_the_tables_own_keys_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as refused:
        index_values(CARTS, KEYS, {"SK": "SKU#b"}, BASE)
    assert refused.value.field == ("attributes", "SK")
    assert "key attribute" in str(refused.value)


def test_a_move_may_remove_an_index_key_and_keeps_numbers_exact() -> None:
    assert index_values(FOLLOWERS, KEYS, {"GSI1PK": None, "GSI1SK": 5}, BASE) == {
        "GSI1PK": None,
        "GSI1SK": Decimal(5),
    }
    check_index_keys(FOLLOWERS, KEYS, {"GSI1PK": None, "GSI1SK": b"x"}, BASE)


def test_the_fence_holds_the_index_keys_as_read_and_a_sums_amount() -> None:
    stored = {"PK": "USER#ann", "SK": "FOLLOWS#x", "GSI1PK": "USER#bob"}
    fenced = fence(FOLLOWERS, KEYS, stored)
    names = fenced.names.expression_names
    assert names == {"#a0": "PK", "#a1": "GSI1PK", "#a2": "GSI1SK"}
    assert fenced.condition == (
        "attribute_exists(#a0) AND #a1 = :index0 AND attribute_not_exists(#a2)"
    )
    assert fenced.values == {":index0": "USER#bob"}
    line = fence(CARTS, KEYS, {"PK": "BASKET#1", "SK": "SKU#a", "qty": Decimal(0)})
    assert line.condition == "attribute_exists(#a0) AND (#a1 = :old OR attribute_not_exists(#a1))"
    assert line.values == {":old": Decimal(0)}


@pytest.mark.parametrize(
    ("messages", "written", "expected"),
    [
        (["Type mismatch for Index Key GSI1SK Expected: S"], {"GSI1PK": "USER#b"}, "GSI1SK"),
        (["Type mismatch for Index Key"], {"GSI1PK": "U", "GSI1SK": Decimal(5)}, "GSI1SK"),
        (["The update expression attempted to update a secondary index key"], {}, "GSI1SK"),
        (["Item size has exceeded the maximum allowed size"], {"GSI1SK": Decimal(5)}, None),
        ([""], {}, None),
    ],
)
def test_an_index_key_dynamodb_refused_is_named(
    messages: list[str], written: dict[str, Any], expected: str | None
) -> None:
    assert refused_index_key(messages, FOLLOWERS, written) == expected


INDEX_VALUE = st.one_of(
    st.none(), st.sampled_from(["USER#bob", "USER#cat", "FOLLOWING#1", "FOLLOWING#2", "MUTED#"])
)


def _contribution(image: dict[str, Any]) -> Counter[str]:
    parent = FOLLOWERS.indexed_parent(image, KEYS)
    return Counter({parent["PK"]: 1}) if parent is not None else Counter()


@given(
    stored_pk=INDEX_VALUE,
    stored_sk=INDEX_VALUE,
    new_pk=INDEX_VALUE,
    new_sk=INDEX_VALUE,
    touch=st.sets(st.sampled_from(["GSI1PK", "GSI1SK"]), min_size=1),
)
def test_a_move_changes_each_parent_by_what_the_new_image_names_minus_the_old(
    stored_pk: Any, stored_sk: Any, new_pk: Any, new_sk: Any, touch: set[str]
) -> None:
    current: dict[str, Any] = {"PK": "USER#ann", "SK": "FOLLOWS#x"}
    for name, value in (("GSI1PK", stored_pk), ("GSI1SK", stored_sk)):
        if value is not None:
            current[name] = value
    requested = {name: {"GSI1PK": new_pk, "GSI1SK": new_sk}[name] for name in touch}
    key = {"PK": "USER#ann", "SK": "FOLLOWS#x"}
    image = {k: v for k, v in {**current, **requested}.items() if v is not None}
    # Leaving the count by status or sparseness is allowed; a GSI1PK that names no USER#
    # parent while the status counts is a mistake, refused on that field, and only then.
    counted_status = str(image.get("GSI1SK", "")).startswith("FOLLOWING#")
    named = image.get("GSI1PK", "USER#")
    mistaken = image != current and counted_status and not named.startswith("USER#")
    try:
        planned = fenced_writes("T", KEYS, "move", key, {}, FOLLOWERS, current, None, requested)
    except InvalidRequestError as refused:
        assert mistaken and refused.field == ("attributes", "GSI1PK")
        return
    assert not mistaken
    if planned is None:
        assert image == current
        return
    entry, parents = planned
    moved: Counter[str] = Counter()
    for parent, delta in parents:
        moved[parent["PK"]] += int(delta)
    expected = _contribution(image)
    expected.subtract(_contribution(current))
    assert {k: v for k, v in moved.items() if v} == {k: v for k, v in expected.items() if v}
    assert len(parents) == len({p["PK"] for p, _ in parents}) <= 2  # one update per parent
    update = entry["Update"]
    assert update["ConditionExpression"].startswith("attribute_exists(")
    for name in ("GSI1PK", "GSI1SK"):  # fenced on the values read, or on their absence
        placeholder = next(p for p, n in update["ExpressionAttributeNames"].items() if n == name)
        if name in current:
            assert f"{placeholder} = :index" in update["ConditionExpression"]
        else:
            assert f"attribute_not_exists({placeholder})" in update["ConditionExpression"]


@given(stored_pk=INDEX_VALUE, stored_sk=INDEX_VALUE)
def test_a_remove_decrements_exactly_the_parent_the_stored_edge_names(
    stored_pk: Any, stored_sk: Any
) -> None:
    current: dict[str, Any] = {"PK": "USER#ann", "SK": "FOLLOWS#x"}
    for name, value in (("GSI1PK", stored_pk), ("GSI1SK", stored_sk)):
        if value is not None:
            current[name] = value
    planned = fenced_writes(
        "T",
        KEYS,
        "remove",
        {"PK": "USER#ann", "SK": "FOLLOWS#x"},
        {},
        FOLLOWERS,
        current,
        None,
        None,
    )
    assert planned is not None
    entry, parents = planned
    assert "Delete" in entry
    assert {p["PK"]: int(d) for p, d in parents} == {
        k: -v for k, v in _contribution(current).items()
    }


def test_a_number_read_in_dynamodbs_plain_notation_is_fenced_as_it_holds_it() -> None:
    """DynamoDB returns 1E+40 as 41 digits; boto3's serializer refuses more than 38 with
    decimal.Rounded. Read by the writers, it is 1E+40 again, and the fence serializes it."""
    raw = {
        "PK": {"S": "USER#ann"},
        "SK": {"S": "FOLLOWS#x"},
        "GSI1PK": {"S": "USER#bob"},
        "GSI1SK": {"N": "1" + "0" * 40},
    }
    current = read_item(raw)
    assert current is not None
    assert current["GSI1SK"].as_tuple() == Decimal("1E+40").as_tuple()
    key = {"PK": "USER#ann", "SK": "FOLLOWS#x"}
    planned = fenced_writes("T", KEYS, "remove", key, {}, FOLLOWERS, current, None, None)
    assert planned is not None
    entry, parents = planned
    assert entry["Delete"]["ExpressionAttributeValues"][":index1"] == {"N": "1E+40"}
    assert parents == []  # a number is no FOLLOWING# status: the edge is counted nowhere


def test_a_move_negates_an_amount_exactly_whatever_its_digits() -> None:
    amount = Decimal("12345678901234567890123456789012345.67")  # 37 digits
    old, new = {"PK": "SKU#a", "SK": "ALLCARTS"}, {"PK": "SKU#b", "SK": "ALLCARTS"}
    assert moves(old, new, amount) == [
        (old, Decimal("-12345678901234567890123456789012345.67")),
        (new, amount),
    ]
