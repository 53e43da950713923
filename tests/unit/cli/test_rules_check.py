"""`tally rules check`: the rules against a table's schema and a sample of its items (moto)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import boto3
import pytest
from moto import mock_aws

from tally.cli.rules_check import check
from tally.core.dynamodb import serialize
from tally.local.template import create_table_from
from tally.rules import RuleSet, parse_rules
from tests.harness.index_tables import FOLLOWERS

LIKES = {
    "name": "likes",
    "kind": "count",
    "parent": {"PK": "POST#*", "SK": "META"},
    "children": {"SK": "LIKE#*"},
    "counter": "likeTally",
}
ISSUES = {
    "name": "issues",
    "kind": "sequence",
    "parent": {"PK": "PROJECT#*", "SK": "COUNTER"},
    "counter": "lastIssue",
    "members": {"layout": "collection", "SK": "ISSUE#*", "width": 4},
}
RULES = parse_rules({"rules": [LIKES, ISSUES]})


def table(
    ddb: Any, name: str, keys: dict[str, str], stream: str | None = "NEW_AND_OLD_IMAGES"
) -> None:
    kwargs: dict[str, Any] = {
        "TableName": name,
        "AttributeDefinitions": [{"AttributeName": n, "AttributeType": t} for n, t in keys.items()],
        "KeySchema": [
            {"AttributeName": n, "KeyType": kind}
            for n, kind in zip(keys, ("HASH", "RANGE"), strict=False)
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }
    if stream:
        kwargs["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream}
    create_table_from(ddb, kwargs, None)


@pytest.fixture
def ddb() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("dynamodb")
        table(client, "social", {"PK": "S", "SK": "S"})
        yield client


def put(ddb: Any, **item: Any) -> None:
    ddb.put_item(TableName="social", Item=serialize(item))


def run(ddb: Any, rules: RuleSet = RULES, table: str = "social", limit: int = 100) -> Any:
    return check(rules, ddb, table, limit)


def test_a_clean_table_is_counted_per_rule_and_role(ddb: Any) -> None:
    put(ddb, PK="POST#1", SK="META", likeTally=2)
    put(ddb, PK="POST#1", SK="LIKE#a")
    put(ddb, PK="POST#1", SK="LIKE#b")
    put(ddb, PK="PROJECT#x", SK="COUNTER", lastIssue=1)
    put(ddb, PK="PROJECT#x", SK="ISSUE#0001")
    put(ddb, PK="USER#1", SK="PROFILE")
    report = run(ddb)
    assert report.flags == []
    assert report.as_json()["rules"] == {
        "likes": {"parents": 1, "children_or_members": 2},
        "issues": {"parents": 1, "children_or_members": 1},
    }
    assert report.sampled == 6 and report.unrelated == 1


def test_parents_without_a_counter_or_with_a_non_number_are_flagged(ddb: Any) -> None:
    put(ddb, PK="POST#1", SK="META")
    put(ddb, PK="POST#2", SK="META", likeTally="7")
    put(ddb, PK="POST#3", SK="META", likeTally=Decimal("1.5"))
    flags = run(ddb).flags
    assert any("POST#1" in f and "no counter" in f for f in flags)
    assert any(
        "POST#2" in f and "holds a string of 1 characters, not a counter" in f for f in flags
    )
    assert any("POST#3" in f and "holds 1.5, not a counter" in f for f in flags)
    assert len(flags) == 3


def test_a_counter_holding_text_is_reported_by_type_never_by_value(ddb: Any) -> None:
    """A real table's counter attribute may hold an e-mail address: the check never prints it."""
    put(ddb, PK="POST#1", SK="META", likeTally="ann@example.com")
    put(ddb, PK="POST#2", SK="META", likeTally={"email": "cy@example.com"})
    put(ddb, PK="POST#3", SK="META", likeTally=b"ann@example.com")
    report = run(ddb)
    shown = report.text() + json.dumps(report.as_json()) + repr(report.rules)
    assert "example.com" not in shown and "ann@" not in shown
    assert sorted(f.split(" holds ")[1] for f in report.flags) == [
        "a binary of 15 bytes, not a counter",
        "a map of 1 entries, not a counter",
        "a string of 15 characters, not a counter",
    ]
    assert all('"PK": "POST#' in f for f in report.flags)  # keys are named, values never


def test_items_beside_counted_items_that_no_rule_counts_are_flagged(ddb: Any) -> None:
    put(ddb, PK="POST#1", SK="META", likeTally=1)
    put(ddb, PK="POST#1", SK="LIKE#a")
    for n in range(3):
        put(ddb, PK="POST#1", SK=f"COMMENT#{n}")
    [flag] = run(ddb).flags
    assert "3 items COMMENT#*" in flag and "'likes'" in flag


def test_members_at_another_width_are_flagged(ddb: Any) -> None:
    put(ddb, PK="PROJECT#x", SK="COUNTER", lastIssue=2)
    put(ddb, PK="PROJECT#x", SK="ISSUE#0001")
    put(ddb, PK="PROJECT#x", SK="ISSUE#2")
    [flag] = run(ddb).flags
    assert "ISSUE#2" in flag and "width" in flag


def test_key_names_the_table_does_not_have_stop_the_check(ddb: Any) -> None:
    table(ddb, "orders", {"pk": "S"})
    report = run(ddb, table="orders")
    assert report.sampled == 0
    assert any("'PK' (S)" in f and "'pk' (S)" in f for f in report.flags)


def test_a_table_without_a_stream_or_an_index_is_flagged(ddb: Any) -> None:
    table(ddb, "quiet", {"PK": "S", "SK": "S"}, stream=None)
    users = {
        "name": "users",
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
    }
    flags = run(ddb, parse_rules({"rules": [LIKES, users]}), table="quiet").flags
    assert any("no stream" in f for f in flags)
    assert any("'SequenceIndex'" in f for f in flags)


def test_the_sample_is_limited(ddb: Any) -> None:
    for n in range(30):
        put(ddb, PK=f"POST#{n}", SK="META", likeTally=0)
    assert run(ddb, limit=7).sampled == 7


def follow(ddb: Any, follower: str, followee: str, status: str = "FOLLOWING") -> None:
    put(
        ddb,
        PK=f"USER#{follower}",
        SK=f"FOLLOWS#USER#{followee}",
        GSI1PK=f"USER#{followee}",
        GSI1SK=f"{status}#2026-11-26",
    )


@pytest.fixture
def graph(ddb: Any) -> Any:
    ddb.delete_table(TableName="social")
    keys = [("PK", "HASH"), ("SK", "RANGE")]
    gsi = [("GSI1PK", "HASH"), ("GSI1SK", "RANGE")]
    create_table_from(
        ddb,
        {
            "TableName": "social",
            "AttributeDefinitions": [
                {"AttributeName": n, "AttributeType": "S"} for n, _ in keys + gsi
            ],
            "KeySchema": [{"AttributeName": n, "KeyType": k} for n, k in keys],
            "GlobalSecondaryIndexes": [
                {
                    "IndexName": "GSI1",
                    "KeySchema": [{"AttributeName": n, "KeyType": k} for n, k in gsi],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            ],
            "BillingMode": "PAY_PER_REQUEST",
            "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        },
        None,
    )
    return ddb


def test_children_found_through_an_index_are_those_whose_index_key_names_a_parent(
    graph: Any,
) -> None:
    put(graph, PK="USER#ann", SK="PROFILE", followerCount=1)
    put(graph, PK="USER#bob", SK="PROFILE", followerCount=0)
    follow(graph, "ann", "bob")
    follow(graph, "cy", "bob")
    follow(graph, "bob", "ann", status="BLOCKED")  # an edge, not a follower
    put(graph, PK="USER#ann", SK="FOLLOWS#USER#dee")  # no index key: not in the index
    put(graph, PK="USER#ann", SK="POST#1")  # beside a profile, no child of its
    report = run(graph, parse_rules({"rules": [FOLLOWERS]}))
    assert report.as_json()["rules"] == {
        "followers": {"parents": 2, "children_or_members": 2, "not_counted": 2}
    }
    # The edges sit in the followers' collections, not the followee's: nothing there is a
    # stray of the rule's.
    assert report.flags == [] and report.strays == []
    assert report.unrelated == 1
    assert (
        "followers: 2 sampled items keyed like its children name no parent through GSI1 "
        "(no GSI1PK, or GSI1SK not FOLLOWING#...): not counted"
    ) in report.text()


def test_a_missing_index_stops_no_check_of_the_items(graph: Any) -> None:
    through = dict(FOLLOWERS["through"]) | {"index": "ByFollowee"}  # type: ignore[arg-type]
    put(graph, PK="USER#bob", SK="PROFILE", followerCount=1)
    follow(graph, "ann", "bob")
    report = run(graph, parse_rules({"rules": [FOLLOWERS | {"through": through}]}))
    assert report.flags == [
        "rule 'followers' field 'through.index': table social has no index 'ByFollowee'"
    ]
    assert report.as_json()["rules"]["followers"]["children_or_members"] == 1
