"""Count and sum rules whose children are found through an index (``through``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.rules import RulesFileError, parse_rules
from tests.harness.index_tables import FOLLOWERS


def rules_with(**changes: Any) -> Any:
    return parse_rules({"rules": [FOLLOWERS | changes]})


def test_an_edge_is_an_indexed_child_whose_parent_its_key_does_not_name() -> None:
    rules = rules_with()
    (match,) = rules.classify({"PK": "USER#ann", "SK": "FOLLOWS#USER#bob"})
    assert (match.role, match.parent_key) == ("indexed", {})
    (parent,) = rules.classify({"PK": "USER#bob", "SK": "PROFILE"})
    assert parent.role == "parent"
    assert rules.classify({"PK": "USER#ann", "SK": "POST#1"}) == []


def test_the_parent_is_named_by_the_index_key_in_the_image() -> None:
    rules = rules_with()
    rule = rules["followers"]
    image = {"GSI1PK": "USER#bob", "GSI1SK": "FOLLOWING#2026-11-26"}
    assert rule.indexed_parent(image, rules.table) == {"PK": "USER#bob", "SK": "PROFILE"}


@pytest.mark.parametrize(
    "image",
    [
        {},  # sparse: no index key, no child
        {"GSI1SK": "FOLLOWING#1"},
        {"GSI1PK": "USER#bob"},  # no status
        {"GSI1PK": "USER#bob", "GSI1SK": "BLOCKED#1"},  # another status
        {"GSI1PK": "TEAM#x", "GSI1SK": "FOLLOWING#1"},  # no parent of this rule's
        {"GSI1PK": 7, "GSI1SK": "FOLLOWING#1"},
        {"GSI1PK": Decimal(7), "GSI1SK": "FOLLOWING#1"},  # a number: no S index holds it
        {"GSI1PK": "", "GSI1SK": "FOLLOWING#1"},
    ],
)
def test_an_image_without_the_counted_index_key_is_no_child(image: dict[str, Any]) -> None:
    rules = rules_with()
    assert rules["followers"].indexed_parent(image, rules.table) is None


@given(
    followee=st.text(min_size=1, max_size=20),
    status=st.text(max_size=12),
    prefix=st.sampled_from(["USER#", "TEAM#", ""]),
)
def test_an_image_names_a_parent_exactly_when_its_index_key_is_counted(
    followee: str, status: str, prefix: str
) -> None:
    rules = rules_with()
    image = {"GSI1PK": prefix + followee, "GSI1SK": status}
    named = rules["followers"].indexed_parent(image, rules.table)
    counted = prefix == "USER#" and status.startswith("FOLLOWING#")
    assert named == ({"PK": "USER#" + followee, "SK": "PROFILE"} if counted else None)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"through": {"index": "G", "partition_key": "PK"}}, "through.partition_key"),
        ({"through": {"index": "G", "partition_key": "G1", "sort_prefix": "A#"}}, "sort_key"),
        ({"parent": {"PK": "USER#ann", "SK": "PROFILE"}}, "field 'parent'"),
        ({"on_ttl_expiry": "decrement"}, "field 'on_ttl_expiry'"),
        ({"children": {"PK": "USER#*", "SK": "PROFILE"}}, "both parent and child"),
        ({"through": {"index": "G", "partition_key": "G1", "grace_seconds": 0}}, "grace_seconds"),
        ({"through": {"index": "G", "partition_key": "G1", "window_seconds": 59}}, "window"),
        (
            {
                "through": {
                    "index": "G",
                    "partition_key": "G1",
                    "grace_seconds": 40,
                    "window_seconds": 80,
                }
            },
            "more than twice grace_seconds",
        ),
    ],
)
def test_a_rule_through_an_index_that_cannot_work_is_refused_by_field(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(RulesFileError, match="followers") as refused:
        rules_with(**changes)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("grace", "window", "expected"),
    [(2, None, 900), (100, None, 1000), (2, 60, 60), (900, 86_400, 86_400)],
)
def test_the_window_is_nine_hundred_seconds_or_ten_graces_unless_given(
    grace: int, window: int | None, expected: int
) -> None:
    through: dict[str, Any] = {"index": "G", "partition_key": "G1", "grace_seconds": grace}
    if window is not None:
        through["window_seconds"] = window
    rule = rules_with(through=through)["followers"]
    assert rule.through is not None and rule.through.window == expected


def test_a_summed_attribute_that_is_an_index_key_is_refused() -> None:
    with pytest.raises(RulesFileError, match="field 'summed'"):
        rules_with(kind="sum", summed="GSI1PK", counter="total")


def test_a_rule_through_an_index_repairs_only_with_a_revision() -> None:
    """Without a revision, a counter that went A->B->A between two looks would pass for one
    that held still; such a rule may alert, not repair."""
    with pytest.raises(RulesFileError, match="field 'revision'"):
        rules_with(repair="auto")
    assert rules_with(repair="auto", revision="rev")["followers"].repair == "auto"
    assert rules_with(repair="alert")["followers"].revision is None


STAMPED = {"index": "G", "partition_key": "G1", "stamp": "st", "stamp_depth": 4}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "needs the rule's revision"),
        ({"revision": "rev", "counter": "st0"}, "must differ"),
        ({"revision": "stChild"}, "must differ"),
        ({"revision": "rev", "through": {**STAMPED, "stamp": "G1"}}, "index's key attributes"),
        ({"revision": "rev", "through": {**STAMPED, "stamp_depth": 1}}, "stamp_depth"),
        ({"revision": "rev", "through": {**STAMPED, "stamp_depth": 65}}, "stamp_depth"),
        ({"revision": "rev", "through": {**STAMPED, "stamp": ""}}, "stamp"),
    ],
)
def test_a_stamp_that_cannot_prove_a_revision_is_refused_by_field(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(RulesFileError, match="followers") as refused:
        rules_with(**{"through": STAMPED, **changes})
    assert message in str(refused.value)


def test_a_stamped_parent_keeps_its_stamps_newest_first_and_the_newest_ones_child() -> None:
    rule = rules_with(revision="rev", through=STAMPED)["followers"]
    assert rule.through is not None
    assert rule.through.stamps == ("st0", "st1", "st2", "st3")
    assert rule.through.stamp_child == "stChild"
    unstamped = rules_with()["followers"].through
    assert unstamped is not None and (unstamped.stamps, unstamped.stamp_child) == ((), None)
