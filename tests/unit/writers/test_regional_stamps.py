"""A writer given a Region stamps what ``tally.core.regions`` names, and nothing else changes."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tally.core.regions import CHILD_ID, ORIGIN, writes
from tally.writers.regional import homed_elsewhere, stamped, stamped_update

KEY = {"PK": {"S": "POST#1"}, "SK": {"S": "LIKE#1"}}
PARENT = {"PK": {"S": "POST#1"}, "SK": {"S": "META"}}


def parent_update(expression: str = "ADD #c :delta, #r :one") -> dict[str, Any]:
    return {
        "Update": {
            "TableName": "t",
            "Key": PARENT,
            "UpdateExpression": expression,
            "ConditionExpression": "attribute_exists(#pk)",
            "ExpressionAttributeNames": {"#c": "likeTally", "#r": "rev", "#pk": "PK"},
            "ExpressionAttributeValues": {":delta": {"N": "1"}, ":one": {"N": "1"}},
        }
    }


def test_a_created_child_gets_the_origin_and_an_id_made_in_its_region() -> None:
    put = {
        "Put": {"TableName": "t", "Item": KEY, "ConditionExpression": "attribute_not_exists(PK)"}
    }
    [out] = stamped([put], "eu-west-1", child_id=lambda r: f"{r}:abc")
    assert out["Put"]["Item"] == {
        **KEY,
        ORIGIN: {"S": "eu-west-1"},
        CHILD_ID: {"S": "eu-west-1:abc"},
    }
    assert out["Put"]["ConditionExpression"] == "attribute_not_exists(PK)"
    assert put["Put"]["Item"] == KEY  # the caller's action is not changed


def test_a_put_that_replaces_keeps_no_new_id() -> None:
    put = {"Put": {"TableName": "t", "Item": KEY}}
    [out] = stamped([put], "eu-west-1")
    assert CHILD_ID not in out["Put"]["Item"]


def test_a_parents_counter_update_counts_one_more_write_of_this_region() -> None:
    [out] = stamped([parent_update()], "us-east-1")
    update = out["Update"]
    assert update["UpdateExpression"] == (
        "ADD #tallyWrites :tallyOne, #c :delta, #r :one SET #tallyOrigin = :tallyOrigin"
    )
    assert update["ExpressionAttributeNames"]["#tallyWrites"] == writes("us-east-1")
    assert update["ConditionExpression"] == (
        "(attribute_exists(#pk)) AND "
        "(attribute_not_exists(#tallyHome) OR #tallyHome = :tallyOrigin)"
    )


def test_an_update_with_its_own_set_clause_gets_the_origin_in_it() -> None:
    request = parent_update("ADD #c :delta SET #r = :one")["Update"]
    out = stamped_update(request, "us-east-1")
    assert out["UpdateExpression"] == (
        "ADD #tallyWrites :tallyOne, #c :delta SET #tallyOrigin = :tallyOrigin, #r = :one"
    )


def test_deletes_and_checks_are_left_as_they_are() -> None:
    actions = [
        {"Delete": {"TableName": "t", "Key": KEY}},
        {"ConditionCheck": {"TableName": "t", "Key": PARENT, "ConditionExpression": "x"}},
    ]
    assert stamped(actions, "us-east-1") == actions


@given(st.sampled_from(["us-east-1", "eu-west-1", "ap-southeast-2"]), st.integers(1, 5))
def test_every_action_of_any_transaction_keeps_its_kind_and_key(region: str, n: int) -> None:
    actions = [parent_update(), {"Put": {"TableName": "t", "Item": KEY}}] * n
    out = stamped(actions, region)
    assert [next(iter(a)) for a in out] == [next(iter(a)) for a in actions]
    assert all(
        next(iter(o.values())).get("Key", next(iter(o.values())).get("Item", {})).items()
        >= next(iter(a.values())).get("Key", {}).items()
        for o, a in zip(out, actions, strict=True)
    )


def test_the_writers_parent_update_is_the_one_recognised_by_its_delta() -> None:
    """``regional`` knows a parent's counter update by ``parent_update``'s ``:delta``."""
    from decimal import Decimal

    from tally.rules import DEFAULT_RULES_FILE, load_rules
    from tally.writers.parents import parent_update as real_update

    rules = load_rules(DEFAULT_RULES_FILE)
    rule = rules["likes"]
    update = real_update("t", {"PK": "POST#1", "SK": "META"}, rule, Decimal(1), rules.table)  # type: ignore[arg-type]
    [out] = stamped([update], "eu-west-1")
    assert "#tallyWrites :tallyOne" in out["Update"]["UpdateExpression"]


# --- the home fence ------------------------------------------------------------------------


def _enclosed(condition: str) -> bool:
    depth = 0
    for at, char in enumerate(condition):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and at < len(condition) - 1:
            return False
    return condition.startswith("(")


operands = st.sampled_from(["#a = :a", "attribute_exists(#pk)", "#n BETWEEN :l AND :h"])
conditions = st.recursive(
    operands,
    lambda inner: st.one_of(
        st.builds(lambda c: c if _enclosed(c) else f"({c})", inner),  # never "((c))"
        st.builds(lambda a, op, b: f"{a} {op} {b}", inner, st.sampled_from(["AND", "OR"]), inner),
    ),
    max_leaves=6,
)


@given(conditions)
def test_a_fenced_condition_keeps_its_meaning_and_never_doubles_parentheses(condition: str) -> None:
    fenced = stamped_update(
        {"UpdateExpression": "SET #a = :a", "ConditionExpression": condition}, "eu-west-1"
    )
    expression = fenced["ConditionExpression"]
    first, _, fence = expression.rpartition(" AND ")
    assert fence == "(attribute_not_exists(#tallyHome) OR #tallyHome = :tallyOrigin)"
    assert _enclosed(first) and first.strip("()") == condition.strip("()")
    assert not (first.startswith("((") and _enclosed(first[1:-1]))  # redundant: refused
    assert first == (condition if _enclosed(condition) else f"({condition})")
    assert fenced["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    assert fenced["ExpressionAttributeNames"]["#tallyHome"] == "tallyHome"


def test_an_update_without_a_condition_gets_the_fence_alone_and_mrsc_none() -> None:
    fenced = stamped_update({"UpdateExpression": "ADD #c :delta"}, "us-east-1")
    assert fenced["ConditionExpression"].startswith("(attribute_not_exists(#tallyHome)")
    plain = stamped_update({"UpdateExpression": "ADD #c :delta"}, "us-east-1", fence_home=False)
    assert (
        "ConditionExpression" not in plain and "#tallyHome" not in plain["ExpressionAttributeNames"]
    )


@given(
    st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["tallyHome", "x"]), st.one_of(st.text(max_size=12), st.integers())
        ),
    )
)
def test_only_another_regions_name_in_the_home_is_a_refusal(item: dict[str, Any] | None) -> None:
    home = (item or {}).get("tallyHome")
    expected = home if isinstance(home, str) and home != "eu-west-1" else None
    assert homed_elsewhere(item, "eu-west-1") == expected
