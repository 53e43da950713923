"""The example tables of docs/adopting.md, filled by their teams' own writers:
``tally examples load SHAPE`` writes correct traffic, ``tally examples fault SHAPE`` the
fault each walk-through catches.

The writers are the seed articles' code (seed 004's likes, seed 001's orders, seed 002's
numbered issues) and a social graph's follow, unfollow and block transactions, as the tests
run them too. The data is the same on every run (seeded), so
the walk-throughs' outputs can be shown as they come.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any


class Crash(Exception):
    """The writer process died here: nothing after this point ran."""


def _put_once(
    client: Any, table: str, item: dict[str, Any], key: str, parent: dict[str, Any]
) -> None:
    """The item, put only while no item has its key, and its parent's update: one transaction."""
    put = {"TableName": table, "Item": item, "ConditionExpression": f"attribute_not_exists({key})"}
    client.transact_write_items(TransactItems=[{"Put": put}, parent])


def _update(
    table: str, key: dict[str, Any], expression: str, values: dict[str, Any], condition: str = ""
) -> dict[str, Any]:
    """A transaction's update of the item under ``key``, only if ``condition`` holds."""
    update = {
        "TableName": table,
        "Key": key,
        "UpdateExpression": expression,
        "ExpressionAttributeValues": values,
    }
    return {"Update": update | ({"ConditionExpression": condition} if condition else {})}


# --- seed 004: likes and likeTally in one transaction ------------------------------------------


def create_post(client: Any, table: str, post: str) -> None:
    item = {"PK": {"S": post}, "SK": {"S": "META"}, "likeTally": {"N": "0"}, "body": {"S": "hi"}}
    client.put_item(TableName=table, Item=item)


def like(client: Any, table: str, post: str, user: str) -> None:
    """Seed 004's writer: the like and the count in one transaction, the like only once."""
    liked = {"PK": {"S": post}, "SK": {"S": f"LIKE#USER#{user}"}, "likedAt": {"N": "1750636800"}}
    meta = {"PK": {"S": post}, "SK": {"S": "META"}}
    tally = _update(table, meta, "ADD likeTally :one", {":one": {"N": "1"}})
    _put_once(client, table, liked, "SK", tally)


# --- seed 001: ADD, then put under the new number ----------------------------------------------


def place_order(client: Any, table: str, *, crash: bool = False) -> int:
    """Seed 001's writer: ADD to the counter, then put the order under the new number."""
    response = client.update_item(
        TableName=table,
        Key={"pk": {"S": "orderCounter"}},
        UpdateExpression="ADD #cnt :val",
        ExpressionAttributeNames={"#cnt": "count"},
        ExpressionAttributeValues={":val": {"N": "1"}},
        ReturnValues="UPDATED_NEW",
    )
    number = response["Attributes"]["count"]["N"]
    if crash:
        raise Crash("between the counter and the order")
    client.put_item(
        TableName=table, Item={"pk": {"S": number}, "deliveryMethod": {"S": "expedited"}}
    )
    return int(number)


# --- seed 002: issues under a number sort key, lastIssue on the project's item -----------------


def create_project(client: Any, table: str, project: str) -> None:
    item = {"pk": {"S": project}, "sk": {"N": "0"}, "lastIssue": {"N": "0"}}
    client.put_item(TableName=table, Item=item)


def open_issue(client: Any, table: str, project: str) -> int:
    """Seed 002's writer: the highest issue number plus one, put only if absent; the project's
    lastIssue follows in the same transaction."""
    found = client.query(
        TableName=table,
        KeyConditionExpression="pk = :p AND sk > :zero",
        ExpressionAttributeValues={":p": {"S": project}, ":zero": {"N": "0"}},
        ScanIndexForward=False,
        Limit=1,
        ConsistentRead=True,
    )["Items"]
    number = int(found[0]["sk"]["N"]) + 1 if found else 1
    issue = {"pk": {"S": project}, "sk": {"N": str(number)}, "priority": {"S": "low"}}
    meta = {"pk": {"S": project}, "sk": {"N": "0"}}
    last = _update(table, meta, "SET lastIssue = :n", {":n": {"N": str(number)}})
    _put_once(client, table, issue, "pk", last)
    return number


# --- followers: an edge in the follower's collection, the count on the followee's profile ------


def create_profile(client: Any, table: str, user: str) -> None:
    item = {
        "PK": {"S": f"USER#{user}"},
        "SK": {"S": "PROFILE"},
        "followerCount": {"N": "0"},
        "rev": {"N": "0"},
    }
    client.put_item(TableName=table, Item=item)


def _edge_key(follower: str, followee: str) -> dict[str, Any]:
    return {"PK": {"S": f"USER#{follower}"}, "SK": {"S": f"FOLLOWS#{followee}"}}


def _count(table: str, followee: str, delta: int) -> dict[str, Any]:
    """The followee's followerCount moved by ``delta``, its revision by one."""
    profile = {"PK": {"S": f"USER#{followee}"}, "SK": {"S": "PROFILE"}}
    values = {":delta": {"N": str(delta)}, ":one": {"N": "1"}}
    return _update(
        table, profile, "ADD followerCount :delta, rev :one", values, "attribute_exists(PK)"
    )


def follow(client: Any, table: str, follower: str, followee: str, day: str) -> None:
    """The edge, listed under the followee in GSI1, and the followee's count: one transaction,
    the edge only once."""
    edge = _edge_key(follower, followee) | {
        "GSI1PK": {"S": f"USER#{followee}"},
        "GSI1SK": {"S": f"FOLLOWING#{day}"},
    }
    _put_once(client, table, edge, "PK", _count(table, followee, 1))


_FOLLOWING = {":following": {"S": "FOLLOWING#"}}


def unfollow(client: Any, table: str, follower: str, followee: str) -> None:
    """The edge deleted and the count lowered, only while the edge still counts."""
    client.transact_write_items(
        TransactItems=[
            {
                "Delete": {
                    "TableName": table,
                    "Key": _edge_key(follower, followee),
                    "ConditionExpression": "begins_with(GSI1SK, :following)",
                    "ExpressionAttributeValues": _FOLLOWING,
                }
            },
            _count(table, followee, -1),
        ]
    )


def block(client: Any, table: str, follower: str, followee: str, day: str) -> None:
    """The followee blocks a follower: the edge stays, its status leaves FOLLOWING#, and the
    count drops with it."""
    blocked = _update(
        table,
        _edge_key(follower, followee),
        "SET GSI1SK = :blocked",
        _FOLLOWING | {":blocked": {"S": f"BLOCKED#{day}"}},
        "begins_with(GSI1SK, :following)",
    )
    client.transact_write_items(TransactItems=[blocked, _count(table, followee, -1)])


# --- the examples: correct traffic, then the fault each walk-through catches ------------------


def _parents_and_children(
    children: Mapping[str, Sequence[Any]],
    create: Callable[[str], object],
    add: Callable[[str, Any], object],
) -> int:
    """Each parent created, then each of its children added: how many items that wrote."""
    for parent, its_children in children.items():
        create(parent)
        for child in its_children:
            add(parent, child)
    return len(children) + sum(len(its_children) for its_children in children.values())


def _social(client: Any, table: str) -> int:
    rng = random.Random(4)
    likes = {
        f"POST#{p:04x}": [f"{user:04x}" for user in rng.sample(range(100), rng.randrange(0, 10))]
        for p in range(40)
    }
    return _parents_and_children(
        likes, partial(create_post, client, table), partial(like, client, table)
    )


def _social_fault(client: Any, table: str) -> str:
    client.put_item(
        TableName=table, Item={"PK": {"S": "POST#0003"}, "SK": {"S": "LIKE#USER#import"}}
    )
    return "a batch import put a like in POST#0003 without its count"


def _followers(client: Any, table: str) -> int:
    rng = random.Random(6)
    users = [f"u{n:02d}" for n in range(30)]
    for user in users:
        create_profile(client, table, user)
    edges = []
    for day, follower in enumerate(users, start=1):
        for followee in rng.sample([u for u in users if u != follower], rng.randrange(0, 8)):
            follow(client, table, follower, followee, f"2026-11-{day:02d}")
            edges.append((follower, followee))
    for follower, followee in rng.sample(edges, 12):
        if rng.random() < 0.5:
            unfollow(client, table, follower, followee)
            edges.remove((follower, followee))
        else:
            block(client, table, follower, followee, "2026-11-30")
    return len(users) + len(edges)  # profiles and the edges still there


def _followers_fault(client: Any, table: str) -> str:
    (edge,) = client.query(
        TableName=table,
        IndexName="GSI1",
        KeyConditionExpression="GSI1PK = :followee AND begins_with(GSI1SK, :following)",
        ExpressionAttributeValues={":followee": {"S": "USER#u07"}} | _FOLLOWING,
        Limit=1,
    )["Items"]
    client.update_item(
        TableName=table,
        Key={"PK": edge["PK"], "SK": edge["SK"]},
        UpdateExpression="SET GSI1SK = :blocked",
        ExpressionAttributeValues={":blocked": {"S": "BLOCKED#2026-12-01"}},
    )
    follower = edge["PK"]["S"].removeprefix("USER#")
    return f"a moderation job blocked {follower}'s follow of u07, followerCount left as it was"


def _orders(client: Any, table: str) -> int:
    for _ in range(120):
        place_order(client, table)
    client.put_item(TableName=table, Item={"pk": {"S": "customer#7"}, "name": {"S": "Ada"}})
    return 122  # the counter, 120 orders, a customer


def _orders_fault(client: Any, table: str) -> str:
    with contextlib.suppress(Crash):
        place_order(client, table, crash=True)
    lost = place_order(client, table) - 1
    return f"the writer crashed between its two steps: order {lost} was never put"


def _projects(client: Any, table: str) -> int:
    rng = random.Random(2)
    issues = {f"project{p:02d}": range(rng.randrange(1, 12)) for p in range(20)}
    return _parents_and_children(
        issues,
        partial(create_project, client, table),
        lambda project, _: open_issue(client, table, project),
    )


def _projects_fault(client: Any, table: str) -> str:
    key = {"pk": {"S": "project07"}, "sk": {"N": "0"}}
    last = int(client.get_item(TableName=table, Key=key)["Item"]["lastIssue"]["N"])
    client.put_item(
        TableName=table,
        Item={"pk": {"S": "project07"}, "sk": {"N": str(last + 1)}, "priority": {"S": "high"}},
    )
    return f"a back-office import put issue {last + 1} of project07, lastIssue left at {last}"


@dataclass(frozen=True)
class Example:
    """One walk-through's table: its writers' correct traffic and its fault."""

    name: str
    table_id: str
    summary: str
    load: Callable[[Any, str], int]
    fault: Callable[[Any, str], str]

    def directory(self, root: Path) -> Path:
        return root / "examples" / "adopting" / self.name


EXAMPLES = {
    e.name: e
    for e in (
        Example(
            "social", "SocialTable", "seed 004: 40 posts and their likes", _social, _social_fault
        ),
        Example(
            "followers",
            "FollowersTable",
            "30 users, who follows whom",
            _followers,
            _followers_fault,
        ),
        Example(
            "orders",
            "OrdersTable",
            "seed 001: 120 numbered orders and a customer",
            _orders,
            _orders_fault,
        ),
        Example(
            "projects",
            "ProjectsTable",
            "seed 002: 20 projects and their numbered issues",
            _projects,
            _projects_fault,
        ),
    )
}
