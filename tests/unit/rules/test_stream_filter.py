"""The stream filter derived from the rules admits every key a rule cares about."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.rules import RuleSet, parse_rules
from tally.rules.stream_filter import filter_json, filter_pattern

SOCIAL = {
    "rules": [
        {
            "name": "likes",
            "kind": "count",
            "parent": {"PK": "POST#*", "SK": "META"},
            "children": {"SK": "LIKE#*"},
            "counter": "likeTally",
        },
        {
            "name": "user-numbers",
            "kind": "sequence",
            "parent": {"PK": "UserMetadata", "SK": "META"},
            "counter": "LastID",
            "members": {
                "layout": "index",
                "key": {"PK": "User#*"},
                "index": "SequenceIndex",
                "sequence_attribute": "seqName",
                "number": "NumIdentifier",
            },
        },
    ]
}
ORDERS = {
    "table": {"partition_key": "pk"},
    "rules": [
        {
            "name": "order-ids",
            "kind": "sequence",
            "parent": {"pk": "orderCounter"},
            "counter": "count",
            "members": {"layout": "partition", "pk": "ORDER#*"},
        }
    ],
}
PROJECTS = {
    "table": {"partition_key": "pk", "sort_key": "sk", "sort_key_type": "N"},
    "rules": [
        {
            "name": "issues",
            "kind": "sequence",
            "parent": {"pk": "*", "sk": "0"},
            "counter": "lastIssue",
            "members": {"layout": "collection", "sk": "*"},
        }
    ],
}
NUMBERED_TEAMS = {
    "table": {"partition_key": "team", "sort_key": "sk", "partition_key_type": "N"},
    "rules": [
        {
            "name": "members",
            "kind": "count",
            "parent": {"team": "7", "sk": "META"},
            "children": {"sk": "MEMBER#*"},
            "counter": "members",
        }
    ],
}


def admits(element: Any, value: str) -> bool:
    """Lambda's event filtering for the element forms the filter uses."""
    if isinstance(element, str):
        return value == element
    if "prefix" in element:
        return value.startswith(element["prefix"])
    if element == {"exists": True}:
        return True
    operator, operand = element["numeric"]
    number = Decimal(value)
    return number > operand if operator == ">" else number == operand


def passes(rules: RuleSet, key: dict[str, str]) -> bool:
    pk = rules.table.partition_key
    [(kind, elements)] = filter_pattern(rules)["dynamodb"]["Keys"][pk].items()
    assert kind == rules.table.partition_key_type
    return any(admits(element, key[pk]) for element in elements)


def test_the_filter_names_the_partition_key_and_its_type_only() -> None:
    assert json.loads(filter_json(parse_rules(NUMBERED_TEAMS))) == {
        "dynamodb": {"Keys": {"team": {"N": [{"numeric": ["=", 7]}]}}}
    }


def test_a_numbered_partition_key_is_its_prefix_then_a_digit() -> None:
    pattern = filter_pattern(parse_rules(ORDERS))["dynamodb"]["Keys"]["pk"]["S"]
    assert pattern == ["orderCounter", *({"prefix": f"ORDER#{d}"} for d in "0123456789")]


def test_a_rule_open_on_the_partition_key_admits_every_record() -> None:
    assert filter_pattern(parse_rules(PROJECTS))["dynamodb"]["Keys"]["pk"]["S"] == [
        {"exists": True}
    ]


def test_index_members_are_admitted_by_their_own_partition_key() -> None:
    rules = parse_rules(SOCIAL)
    assert passes(rules, {"PK": "User#Kirk", "SK": "PROFILE"})
    assert passes(rules, {"PK": "UserMetadata", "SK": "META"})
    assert not passes(rules, {"PK": "NOTE#1", "SK": "META"})


keys = st.fixed_dictionaries(
    {
        "PK": st.sampled_from(["POST#", "POST", "User#", "UserMetadata", "NOTE#", ""]).flatmap(
            lambda p: st.text(alphabet="a1#", max_size=3).map(lambda s: p + s)
        ),
        "SK": st.sampled_from(["META", "LIKE#1", "PROFILE", "x"]),
    }
).filter(lambda key: key["PK"] != "")
order_keys = st.text(alphabet="ORDE#0123Cc", min_size=1, max_size=8).map(lambda pk: {"pk": pk})


@given(key=keys)
def test_every_key_a_rule_cares_about_passes(key: dict[str, str]) -> None:
    rules = parse_rules(SOCIAL)
    if rules.classify(key):
        assert passes(rules, key)
    elif not key["PK"].startswith(("POST#", "User#", "UserMetadata")):
        assert not passes(rules, key)


@given(key=order_keys)
def test_every_order_key_a_rule_cares_about_passes(key: dict[str, str]) -> None:
    rules = parse_rules(ORDERS)
    if rules.classify(key):
        assert passes(rules, key)


@pytest.mark.parametrize("document", [SOCIAL, ORDERS, PROJECTS, NUMBERED_TEAMS])
def test_the_filter_fits_lambdas_limit(document: dict[str, Any]) -> None:
    assert len(filter_json(parse_rules(document))) <= 4096
