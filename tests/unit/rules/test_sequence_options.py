"""counter_holds and the attribute layout: what the rules accept, and what the stream's
grouping makes of the seeds' records."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.stream.grouping import group_records
from tally.rules import RulesFileError, SequenceRule, parse_rules
from tests.utils import stream_record

USERS: dict[str, Any] = {
    "table": {"partition_key": "PK"},
    "rules": [
        {
            "name": "user-ids",
            "kind": "sequence",
            "parent": {"PK": "UserMetadata"},
            "counter": "LastID",
            "members": {"layout": "attribute", "key": {"PK": "User#*"}, "number": "NumIdentifier"},
        }
    ],
}


def counter_rules(holds: str) -> Any:
    rule = {
        "name": "numbers",
        "kind": "sequence",
        "parent": {"pk": "counter"},
        "counter": "count_value",
        "counter_holds": holds,
        "members": {"layout": "partition", "pk": "*", "width": 1},
    }
    return parse_rules({"table": {"partition_key": "pk"}, "rules": [rule]})


@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["last", "next"]))
def test_member_keys_and_numbers_round_trip(number: int, holds: str) -> None:
    rules = counter_rules(holds)
    rule = rules["numbers"]
    assert isinstance(rule, SequenceRule)
    ordinal = rule.ordinal(number)
    key = rule.member_key({"pk": "counter"}, ordinal, rules.table)
    assert key == {"pk": str(number)}
    assert rule.member_number(key["pk"]) == ordinal
    assert rule.shown_number(ordinal) == number


def collection_rules(holds: str) -> Any:
    rules: dict[str, Any] = {
        "table": {"partition_key": "PK", "sort_key": "SK"},
        "rules": [
            {
                "name": "issues",
                "kind": "sequence",
                "parent": {"PK": "PROJECT#*", "SK": "COUNTER#ISSUE"},
                "counter": "lastIssue",
                "counter_holds": holds,
                "members": {"layout": "collection", "SK": "ISSUE#*", "width": 10},
            },
            {
                "name": "users",
                "kind": "sequence",
                "parent": {"PK": "UserMetadata", "SK": "META"},
                "counter": "LastID",
                "counter_holds": holds,
                "members": {
                    "layout": "index",
                    "key": {"PK": "User#*"},
                    "index": "SequenceIndex",
                    "sequence_attribute": "seqName",
                    "number": "NumIdentifier",
                },
            },
        ],
    }
    return parse_rules(rules)


COLLECTIONS = {holds: collection_rules(holds) for holds in ("last", "next")}
numbers = st.integers(min_value=0, max_value=10**9)


@settings(max_examples=1000, deadline=None)
@given(numbers, numbers, st.sampled_from(["last", "next"]))
def test_a_members_range_read_starts_at_the_first_ordinal_above_the_watermark(
    watermark: int, number: int, holds: str
) -> None:
    """The collection read's range starts at the key of ordinal watermark + 1: a member's
    key sorts at or after it exactly when the member's ordinal lies above the watermark
    (member 0 is ordinal 1 when the counter holds the next free number)."""
    rules = COLLECTIONS[holds]
    rule = rules["issues"]
    counter = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
    start = rule.member_key(counter, watermark + 1, rules.table)["SK"]
    key = f"ISSUE#{number:010d}"  # as the writer writes its number
    ordinal = rule.member_number(key)
    assert ordinal == rule.ordinal(number)
    assert (key >= start) == (ordinal > watermark)


@settings(max_examples=1000, deadline=None)
@given(numbers, st.integers(min_value=-5, max_value=10**9), st.sampled_from(["last", "next"]))
def test_an_index_read_above_the_watermark_takes_exactly_the_ordinals_above_it(
    watermark: int, number: int, holds: str
) -> None:
    """The index read asks for numbers above the watermark's own number: exactly the members
    whose ordinal lies above the watermark; a tombstone's number is its ordinal's own."""
    rule = COLLECTIONS[holds]["users"]
    ordinal = rule.attribute_number(Decimal(number))
    read = number > rule.shown_number(watermark)
    assert read == (ordinal is not None and ordinal > watermark)
    if ordinal is not None:
        assert rule.shown_number(ordinal) == number


def test_a_next_free_index_member_0_balances_the_first_allocation() -> None:
    rules = COLLECTIONS["next"]
    counter = {"PK": "UserMetadata", "SK": "META"}
    member = {"PK": "User#Kirk", "SK": "PROFILE"}
    records = [
        stream_record("MODIFY", counter, {"LastID": 1}, {"LastID": 0}),
        stream_record("INSERT", member, {"seqName": "users", "NumIdentifier": 0}),
    ]
    [group] = group_records(records, rules).groups.values()
    assert group.inserted == {1: 1} and group.balanced


def test_a_next_free_counter_balances_with_the_item_under_the_value_read() -> None:
    rules = counter_rules("next")
    records = [
        stream_record("MODIFY", {"pk": "counter"}, {"count_value": 1}, {"count_value": 0}),
        stream_record("INSERT", {"pk": "0"}, {"some_attribute": "x"}),
    ]
    [group] = group_records(records, rules).groups.values()
    assert group.balanced


def test_members_only_refuses_a_counter_and_judges_up_to_the_highest_member() -> None:
    rule: dict[str, Any] = {
        "name": "issues",
        "kind": "sequence",
        "parent": {"pk": "*", "sk": "0"},
        "counter_holds": "none",
        "members": {"layout": "collection", "sk": "*"},
    }
    table = {"partition_key": "pk", "sort_key": "sk", "sort_key_type": "N"}
    rules = parse_rules({"table": table, "rules": [rule]})
    records = [stream_record("INSERT", {"pk": "p", "sk": n}, {}) for n in (3, 4)]
    [group] = group_records(records, rules).groups.values()
    assert not group.balanced and group.horizon == 4
    with pytest.raises(RulesFileError, match="drop 'counter'"):
        parse_rules({"table": table, "rules": [rule | {"counter": "lastIssue"}]})


def test_attribute_members_are_ledgered_in_stream_order() -> None:
    rules = parse_rules(USERS)
    records = [
        stream_record("INSERT", {"PK": "User#Kirk"}, {"NumIdentifier": 0}),
        stream_record("MODIFY", {"PK": "User#Kirk"}, {"NumIdentifier": 3}, {"NumIdentifier": 0}),
        stream_record("MODIFY", {"PK": "User#Kirk"}, {"NumIdentifier": 5}, {"NumIdentifier": 3}),
        stream_record(
            "MODIFY",
            {"PK": "User#Kirk"},
            {"UserName": "K", "NumIdentifier": 5},
            {"NumIdentifier": 5},
        ),
    ]
    [group] = group_records(records, rules).groups.values()
    assert [(c.before, c.after) for c in group.ledger] == [(None, 3), (3, 5)]
    assert group.lowest_given_up == 3 and not group.balanced


def test_an_attribute_layout_needs_one_exact_counter() -> None:
    broken = USERS | {"rules": [USERS["rules"][0] | {"parent": {"PK": "Meta*"}}]}
    with pytest.raises(RulesFileError, match="attribute-layout sequence has one exact counter"):
        parse_rules(broken)
