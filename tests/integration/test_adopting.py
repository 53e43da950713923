"""docs/adopting.md, run: three existing table shapes adopted with `tally local up --rules ...
--template ...`, written by their teams' own writers (the seeds' code), checked with `tally rules
check`, proposed by `tally rules suggest`, and each caught in a fault by the pump.

The local stacks use the session's DynamoDB Local (DYNAMODB_ENDPOINT) and start their own moto
server; the Social walk spawns `tally local up`, the rest calls the same entry point in process.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest

from tally.local.examples import (
    Crash,
    create_post,
    create_profile,
    create_project,
    follow,
    like,
    open_issue,
    place_order,
)
from tally.rules import RuleSet
from tests.harness.adopting import Adopted


def same_rule(proposed: RuleSet, example: RuleSet, keys: list[dict[str, str]]) -> None:
    """The proposal is the example's rule: same kind and counter, same roles on every key."""
    [mine], [theirs] = list(proposed), list(example)
    assert (mine.kind, mine.counter) == (theirs.kind, theirs.counter)
    assert proposed.table == example.table
    for key in keys:
        roles = [(m.role, m.parent_key) for m in proposed.classify(key)]
        assert roles == [(m.role, m.parent_key) for m in example.classify(key)], key


def scanned_keys(adopted: Adopted) -> list[dict[str, str]]:
    items = adopted.dynamodb.scan(TableName=adopted.table)["Items"]
    return [
        {k: v.get("S") or v["N"] for k, v in item.items() if k in adopted.rules.table.names}
        for item in items
    ]


# --- seed 004: the Social table (PK/SK) -------------------------------------------------------


def test_social_likes_adopted_checked_suggested_and_a_drift_caught(
    adopt: Callable[..., Adopted],
) -> None:
    social = adopt("social", "SocialTable", spawn=True)
    rng = random.Random(4)
    likes = 0
    for p in range(40):
        post = f"POST#{p:04x}"
        create_post(social.dynamodb, social.table, post)
        for user in rng.sample(range(100), rng.randrange(0, 10)):
            like(social.dynamodb, social.table, post, f"{user:04x}")
            likes += 1
    social.settle()
    assert social.alerts() == []

    report = social.check()  # with the rules the stack was started with
    assert report["rules"]["likes"] == {"parents": 40, "children_or_members": likes}
    assert report["flags"] == []

    same_rule(social.suggested(), social.rules, scanned_keys(social))

    # A batch import puts a like behind the writer's back: the count is one short.
    social.dynamodb.put_item(
        TableName=social.table,
        Item={"PK": {"S": "POST#0003"}, "SK": {"S": "LIKE#USER#import"}},
    )
    social.settle()
    [alert] = social.alerts()
    assert (alert["kind"], alert["rule"], alert["key"]) == (
        "drift",
        "likes",
        {"PK": "POST#0003", "SK": "META"},
    )
    assert alert["actual"] == alert["stored"] + 1
    assert alert["repair"]["status"] == "skipped"  # repair = "alert": nothing written

    # The audit reads the stack's rules (the example's would call this table clean).
    code, out = social.tally("audit", "--json")  # exit 1: it found something
    assert code == 1 and json.loads(out)["findings"] == {"drift": 1}


# --- seed 001: orders keyed by a partition key alone ------------------------------------------


def test_orders_adopted_checked_suggested_and_a_gap_caught(
    adopt: Callable[..., Adopted],
) -> None:
    orders = adopt("orders", "OrdersTable")
    for _ in range(120):
        place_order(orders.dynamodb, orders.table)
    orders.dynamodb.put_item(
        TableName=orders.table, Item={"pk": {"S": "customer#7"}, "name": {"S": "Ada"}}
    )
    orders.settle()
    assert orders.alerts() == []

    report = orders.check()
    assert report["rules"]["order-ids"] == {"parents": 1, "children_or_members": 120}
    assert report["unrelated"] == 1 and report["flags"] == []

    same_rule(orders.suggested(), orders.rules, scanned_keys(orders))

    # The writer crashes between its two steps: number 121 is handed out, never used.
    with pytest.raises(Crash):
        place_order(orders.dynamodb, orders.table, crash=True)
    lost = place_order(orders.dynamodb, orders.table) - 1
    orders.settle()
    [alert] = orders.alerts()
    assert (alert["kind"], alert["rule"], alert["number"]) == ("gap", "order-ids", lost)
    assert alert["key"] == {"pk": "orderCounter"}


# --- seed 002: projects whose issues are numbered by a number sort key ------------------------


def test_projects_adopted_checked_suggested_and_a_counter_behind_caught(
    adopt: Callable[..., Adopted],
) -> None:
    projects = adopt("projects", "ProjectsTable")
    rng = random.Random(2)
    issues = 0
    for p in range(20):
        project = f"project{p:02d}"
        create_project(projects.dynamodb, projects.table, project)
        for _ in range(rng.randrange(1, 12)):
            open_issue(projects.dynamodb, projects.table, project)
            issues += 1
    projects.settle()
    assert projects.alerts() == []

    report = projects.check()
    assert report["rules"]["issue-numbers"] == {"parents": 20, "children_or_members": issues}
    assert report["flags"] == []

    same_rule(projects.suggested(), projects.rules, scanned_keys(projects))

    # A back-office import adds the next issue itself and leaves lastIssue behind.
    last = int(
        projects.dynamodb.get_item(
            TableName=projects.table, Key={"pk": {"S": "project07"}, "sk": {"N": "0"}}
        )["Item"]["lastIssue"]["N"]
    )
    projects.dynamodb.put_item(
        TableName=projects.table,
        Item={"pk": {"S": "project07"}, "sk": {"N": str(last + 1)}, "priority": {"S": "high"}},
    )
    projects.settle()
    [alert] = projects.alerts()
    assert (alert["kind"], alert["key"]) == ("counter_behind", {"pk": "project07", "sk": "0"})
    assert (alert["stored"], alert["actual"]) == (last, last + 1)


# --- followers found through an index -----------------------------------------------------------


def test_followers_through_an_index_adopted_checked_and_a_moved_edge_caught(
    adopt: Callable[..., Adopted],
) -> None:
    """The pump plays the stream on one shard, the recheck queue waits out the index grace
    for real: follows raise nothing; an edge re-pointed to another followee without its
    counts is drift on both profiles, each repaired once two looks agree."""
    graph = adopt("followers", "FollowersTable")
    client, table = graph.dynamodb, graph.table
    for user in ("ann", "bob", "cy", "dan"):
        create_profile(client, table, user)
    for follower, followee in (("ann", "bob"), ("cy", "bob"), ("dan", "bob"), ("bob", "ann")):
        follow(client, table, follower, followee, "2026-11-26")
    graph.settle()
    assert graph.alerts() == []
    counted = {"parents": 4, "children_or_members": 4, "not_counted": 0}
    assert graph.check()["rules"]["followers"] == counted

    # A migration re-points dan's edge from bob to cy, and leaves both counts as they were.
    client.update_item(
        TableName=table,
        Key={"PK": {"S": "USER#dan"}, "SK": {"S": "FOLLOWS#bob"}},
        UpdateExpression="SET GSI1PK = :cy",
        ExpressionAttributeValues={":cy": {"S": "USER#cy"}},
    )
    graph.settle()
    found = sorted(
        (a["kind"], a["key"]["PK"], a["stored"], a["actual"], a["repair"]["status"])
        for a in graph.alerts()
    )
    assert found == [
        ("drift", "USER#bob", 3, 2, "applied"),
        ("drift", "USER#cy", 0, 1, "applied"),
    ]
    counts = {
        user: client.get_item(
            TableName=table, Key={"PK": {"S": f"USER#{user}"}, "SK": {"S": "PROFILE"}}
        )["Item"]["followerCount"]["N"]
        for user in ("bob", "cy")
    }
    assert counts == {"bob": "2", "cy": "1"}
