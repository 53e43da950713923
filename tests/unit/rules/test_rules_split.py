"""A count or sum rule whose counter is split per Region (``split = "region"``): what loads,
what is refused by field, and which keys are its shards (docs/rules.md, "split")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.rules import RulesFileError, parse_rules
from tests.unit.rules.test_rules import issues, likes
from tests.unit.rules.test_rules_refused import refusal

SPLIT = likes(split="region")
ORDERS = {
    "name": "orders",
    "kind": "sum",
    "parent": {"PK": "ORDER#*", "SK": "META"},
    "children": {"SK": "LINE#*"},
    "counter": "total",
    "summed": "amount",
    "split": "region",
}


def test_a_count_or_a_sum_may_split_its_counter_per_region() -> None:
    rules = parse_rules({"rules": [SPLIT, ORDERS]})
    for name in ("likes", "orders"):
        assert rules[name].split == "region"  # type: ignore[union-attr]
    assert parse_rules({"rules": [likes()]})["likes"].split is None  # type: ignore[union-attr]


def test_a_shard_is_the_parents_sort_key_then_region_then_the_region() -> None:
    rules = parse_rules({"rules": [SPLIT]})
    rule = rules["likes"]
    parent = {"PK": "POST#1", "SK": "META"}
    assert rule.shard_key(parent, "eu-west-1", rules.table) == {  # type: ignore[union-attr]
        "PK": "POST#1",
        "SK": "META#REGION#eu-west-1",
    }
    [match] = rules.classify({"PK": "POST#1", "SK": "META#REGION#eu-west-1"})
    assert (match.rule.name, match.role, match.parent_key) == ("likes", "shard", parent)
    [parent_match] = rules.classify(parent)
    assert parent_match.role == "parent"  # the shards' entry never takes the parent
    [child] = rules.classify({"PK": "POST#1", "SK": "LIKE#u1"})
    assert child.role == "child"
    assert parse_rules({"rules": [likes()]}).classify({"PK": "POST#1", "SK": "META#REGION#x"}) == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"split": "az"}, "rule 'likes' field 'split': Input should be 'region'"),
        (
            {"on_ttl_expiry": "decrement"},
            "rule 'likes' field 'split': on_ttl_expiry = 'decrement' is not offered on a split",
        ),
        (
            {"lag_seconds": 5},
            "rule 'likes' field 'split': a counter kept by a stream aggregator (lag_seconds)",
        ),
        (
            {"children": {"SK": "META#*"}},
            "rule 'likes' field 'split': its shards' keys (SK = 'META#REGION#'<Region>) match "
            "its children (SK = 'META#*')",
        ),
    ],
)
def test_a_split_that_cannot_work_is_refused_naming_the_field(
    changes: dict[str, Any], message: str
) -> None:
    [problem] = refusal({"rules": [{**SPLIT, **changes}]})
    assert problem.startswith(message), problem


def test_children_found_through_an_index_are_not_split() -> None:
    followers = likes(
        parent={"PK": "USER#*", "SK": "META"},
        children={"SK": "FOLLOWS#*"},
        through={"index": "G", "partition_key": "G1"},
        revision="rev",
        split="region",
    )
    [problem] = refusal({"rules": [followers]})
    assert problem.startswith("rule 'likes' field 'split': a counter split per Region keeps")


def test_a_sequence_has_no_split() -> None:
    [problem] = refusal({"rules": [issues(split="region")]})
    assert problem == "rule 'issues' field 'split': Extra inputs are not permitted"


def test_a_number_sort_key_cannot_hold_a_shard() -> None:
    table = {"partition_key": "PK", "sort_key": "N", "sort_key_type": "N"}
    rule = likes(parent={"PK": "POST#*", "N": "0"}, children={"N": "*"}, split="region")
    [problem] = refusal({"table": table, "rules": [rule]})
    assert problem.startswith("rule 'likes' field 'split': its shards' sort key is the parent's")


def test_another_rules_parent_at_a_shards_key_is_refused() -> None:
    other = likes(name="pinned", parent={"PK": "POST#*", "SK": "META#REGION#us-east-1"})
    other["children"] = {"SK": "PIN#*"}
    problems = refusal({"rules": [SPLIT, other]})
    assert problems == [
        "rule 'likes' field 'split': matches the parent of rule 'pinned', so an item would "
        "be both parent and shard"
    ]


sort_text = st.text(alphabet="ABCMET#REGIONL", min_size=1, max_size=8)


@given(sort_text, sort_text)
def test_a_split_loads_exactly_when_no_shard_can_be_a_child_and_then_shards_are_only_shards(
    parent_sk: str, children: str
) -> None:
    rule = likes(parent={"PK": "POST#*", "SK": parent_sk}, children={"SK": children + "*"})
    shard = f"{parent_sk}#REGION#us-east-1"
    meets = shard.startswith(children) or children.startswith(f"{parent_sk}#REGION#")
    child_is_parent = parent_sk.startswith(children)
    try:
        rules = parse_rules({"rules": [{**rule, "split": "region"}]})
    except RulesFileError as error:
        assert meets or child_is_parent, str(error)
        return
    assert not meets
    roles = [m.role for m in rules.classify({"PK": "POST#9", "SK": shard})]
    assert roles == ["shard"]
