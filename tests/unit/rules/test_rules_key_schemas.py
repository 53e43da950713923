"""Rules on any key schema: other key names, no sort key, number sort keys."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.rules import RuleSet, RulesFileError, SequenceRule, parse_rules
from tally.rules.key_patterns import Pattern, number_text

# seed 004's Social table, with the writers' own attribute names in lower case
LOWER = {"partition_key": "pk", "sort_key": "sk"}
# seed 001: orders keyed by a partition key alone, a counter item beside them
ORDERS = {"partition_key": "pk"}
# seed 002: projects whose issues are numbered by a number sort key
PROJECTS = {"partition_key": "pk", "sort_key": "sk", "sort_key_type": "N"}


def document(table: dict[str, Any], *rules: dict[str, Any]) -> RuleSet:
    return parse_rules({"table": table, "rules": list(rules)})


def rejected(table: dict[str, Any], *rules: dict[str, Any]) -> str:
    with pytest.raises(RulesFileError) as error:
        document(table, *rules)
    return str(error.value)


def issue_numbers(**overrides: Any) -> dict[str, Any]:
    rule = {
        "name": "issue-numbers",
        "kind": "sequence",
        "parent": {"pk": "PROJECT#*", "sk": "COUNTER"},
        "counter": "lastIssue",
        "members": {"layout": "collection", "sk": "ISSUE#*"},
    }
    return rule | overrides


def order_ids(**overrides: Any) -> dict[str, Any]:
    rule = {
        "name": "order-ids",
        "kind": "sequence",
        "parent": {"pk": "orderCounter"},
        "counter": "count",
        "members": {"layout": "partition", "pk": "*", "width": 1},
    }
    return rule | overrides


def project_issues(**overrides: Any) -> dict[str, Any]:
    rule = {
        "name": "project-issues",
        "kind": "sequence",
        "parent": {"pk": "*", "sk": "0"},
        "counter": "lastIssue",
        "members": {"layout": "collection", "sk": "*"},
    }
    return rule | overrides


def roles(rule_set: RuleSet, key: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    return [(m.rule.name, m.role, m.parent_key) for m in rule_set.classify(key)]


def sequence(rule_set: RuleSet, name: str) -> SequenceRule:
    rule = rule_set[name]
    assert isinstance(rule, SequenceRule)
    return rule


# --- key attribute names other than PK/SK ---------------------------------------------------


def test_members_are_named_after_the_tables_sort_key() -> None:
    rules = document(LOWER, issue_numbers())
    counter = {"pk": "PROJECT#a", "sk": "COUNTER"}
    assert roles(rules, {"pk": "PROJECT#a", "sk": "ISSUE#0000000007"}) == [
        ("issue-numbers", "member", counter)
    ]
    assert roles(rules, counter) == [("issue-numbers", "parent", counter)]
    key = sequence(rules, "issue-numbers").member_key(counter, 7, rules.table)
    assert key == {"pk": "PROJECT#a", "sk": "ISSUE#0000000007"}


def test_a_member_field_not_named_after_the_sort_key_is_refused() -> None:
    message = rejected(LOWER, issue_numbers(members={"layout": "collection", "SK": "ISSUE#*"}))
    assert "'issue-numbers'" in message and "'members'" in message and 'sk = "' in message


def test_key_attributes_the_table_lacks_are_named() -> None:
    message = rejected(LOWER, issue_numbers(parent={"PK": "PROJECT#*", "SK": "COUNTER"}))
    assert "'parent'" in message and "'PK'" in message and "['pk', 'sk']" in message


# --- partition key only (seed 001) ----------------------------------------------------------


def test_orders_keyed_by_their_number_are_members_of_the_counter() -> None:
    rules = document(ORDERS, order_ids())
    counter = {"pk": "orderCounter"}
    assert roles(rules, counter) == [("order-ids", "parent", counter)]
    assert roles(rules, {"pk": "17"}) == [("order-ids", "member", counter)]
    assert roles(rules, {"pk": "customer#17"}) == []
    rule = sequence(rules, "order-ids")
    assert rule.member_key(counter, 17, rules.table) == {"pk": "17"}
    assert rule.member_number("17") == 17


def test_a_count_rule_needs_a_sort_key() -> None:
    count = {
        "name": "lines",
        "kind": "count",
        "parent": {"pk": "ORDER#*"},
        "children": {"pk": "LINE#*"},
        "counter": "lines",
    }
    message = rejected(ORDERS, count)
    assert "'lines'" in message and "sort key" in message and "partition" in message


def test_a_collection_needs_a_sort_key() -> None:
    members = {"layout": "collection", "pk": "*"}
    message = rejected(ORDERS, order_ids(members=members))
    assert "'order-ids'" in message and "sort key" in message and "'partition'" in message


def test_a_partition_layout_has_one_exact_counter() -> None:
    message = rejected(ORDERS, order_ids(parent={"pk": "counter#*"}))
    assert "'parent'" in message and "exact" in message


def test_a_numbered_member_pattern_does_not_swallow_the_counter() -> None:
    # pk = "*" numbers every partition key made of digits: "orderCounter" is not one of them.
    document(ORDERS, order_ids())
    message = rejected(ORDERS, order_ids(parent={"pk": "42"}))
    assert "both parent and member" in message


def test_partition_members_with_a_sort_key_name_an_exact_one() -> None:
    members = {"layout": "partition", "pk": "ORDER#*", "sk": "META"}
    rules = document(LOWER, order_ids(parent={"pk": "COUNTER", "sk": "ORDER"}, members=members))
    assert roles(rules, {"pk": "ORDER#0000000003", "sk": "META"})[0][1] == "member"
    assert roles(rules, {"pk": "ORDER#0000000003", "sk": "LINE#1"}) == []
    members["sk"] = "META*"
    rule = order_ids(parent={"pk": "COUNTER", "sk": "ORDER"}, members=members)
    assert "'members.sk'" in rejected(LOWER, rule)


# --- number sort keys (seed 002) ------------------------------------------------------------


def test_issues_numbered_by_a_number_sort_key() -> None:
    rules = document(PROJECTS, project_issues())
    project = {"pk": "projectA", "sk": "0"}
    assert roles(rules, project) == [("project-issues", "parent", project)]
    assert roles(rules, {"pk": "projectA", "sk": "3"}) == [("project-issues", "member", project)]
    assert roles(rules, {"pk": "projectA", "sk": "1.5"}) == []
    assert roles(rules, {"pk": "projectA", "sk": "-2"}) == []
    rule = sequence(rules, "project-issues")
    assert rule.member_key(project, 12, rules.table) == {"pk": "projectA", "sk": "12"}
    assert rules.table.typed({"pk": "projectA", "sk": "12"}) == {"pk": "projectA", "sk": 12}


def test_deserialized_numbers_classify_like_stream_text() -> None:
    rules = document(PROJECTS, project_issues())
    from_scan = {"pk": "projectA", "sk": Decimal(3), "priority": "low"}
    assert roles(rules, from_scan) == roles(rules, {"pk": "projectA", "sk": "3"})
    assert rules.key_of({"pk": "projectA", "sk": Decimal("0")}) == {"pk": "projectA", "sk": "0"}


def test_number_parent_keys_are_canonical() -> None:
    rules = document(PROJECTS, project_issues(parent={"pk": "*", "sk": "0.0"}))
    assert roles(rules, {"pk": "p", "sk": "0"})[0][1] == "parent"
    assert roles(rules, {"pk": "p", "sk": "4"})[0][2] == {"pk": "p", "sk": "0"}


def test_a_number_key_has_no_prefixes() -> None:
    message = rejected(PROJECTS, project_issues(members={"layout": "collection", "sk": "1*"}))
    assert "'members'" in message and "no prefixes" in message


def test_a_number_key_value_must_be_a_number() -> None:
    message = rejected(PROJECTS, project_issues(parent={"pk": "*", "sk": "META"}))
    assert "'parent'" in message and "not a number" in message


def test_count_children_on_a_number_sort_key_are_every_positive_number() -> None:
    count = {
        "name": "issue-count",
        "kind": "count",
        "parent": {"pk": "*", "sk": "0"},
        "children": {"sk": "*"},
        "counter": "issueCount",
    }
    rules = document(PROJECTS, count)
    assert roles(rules, {"pk": "p", "sk": "2.5"}) == [
        ("issue-count", "child", {"pk": "p", "sk": "0"})
    ]
    assert roles(rules, {"pk": "p", "sk": "0"})[0][1] == "parent"


def test_writers_keys_on_a_number_sort_key_are_in_dynamodbs_form() -> None:
    rules = document(PROJECTS, project_issues())
    rules.validate_key({"pk": "p", "sk": "12"})
    with pytest.raises(ValueError, match="'12'"):
        rules.validate_key({"pk": "p", "sk": "012"})


def test_sort_key_type_without_a_sort_key_is_refused() -> None:
    message = rejected({"partition_key": "pk", "sort_key_type": "N"}, order_ids())
    assert "sort_key_type" in message


# --- properties -----------------------------------------------------------------------------

label = st.text(alphabet="AB#1", max_size=4)
string_pattern = st.builds(
    lambda text, star, numbered: Pattern.parse(
        text + "*" if star else text or "x", numbered=numbered and star
    ),
    label,
    st.booleans(),
    st.booleans(),
)
number_pattern = st.builds(
    lambda text, numbered: Pattern.parse(text, numeric=True, numbered=numbered and text == "*"),
    st.sampled_from(["*", "0", "1", "2", "1.5", "-1", "10"]),
    st.booleans(),
)
string_value = st.text(alphabet="AB#1", min_size=1, max_size=6)
number_value = st.decimals(min_value=-3, max_value=30, places=1).map(number_text)


@given(a=string_pattern, b=string_pattern, value=string_value)
def test_string_patterns_that_match_one_value_overlap(a: Pattern, b: Pattern, value: str) -> None:
    assert a.overlaps(b) == b.overlaps(a)
    if a.matches(value) and b.matches(value):
        assert a.overlaps(b)


@given(a=number_pattern, b=number_pattern, value=number_value)
def test_number_patterns_that_match_one_value_overlap(a: Pattern, b: Pattern, value: str) -> None:
    assert a.overlaps(b) == b.overlaps(a)
    if a.matches(value) and b.matches(value):
        assert a.overlaps(b)


@given(
    prefix=st.text(alphabet="ABC#", max_size=5),
    width=st.integers(1, 12),
    number=st.integers(1, 10**12),
)
def test_a_member_key_carries_its_number(prefix: str, width: int, number: int) -> None:
    rule = issue_numbers(members={"layout": "collection", "sk": prefix + "*", "width": width})
    rule["parent"] = {"pk": "PROJECT#*", "sk": "COUNTER#"}
    rules = document(LOWER, rule)
    key = sequence(rules, "issue-numbers").member_key({"pk": "PROJECT#a"}, number, rules.table)
    assert sequence(rules, "issue-numbers").member_number(key["sk"]) == number
    assert [m.role for m in rules.classify(key)] == ["member"]
