"""Each seed article's writer code as written (tests/harness/seeds.py), on its adopted table
(examples/adopting/), through the real stream and handlers with the pump: no alert on correct
use, and the expected finding for each fault: a lost response (commit, then raise), a crash
between the writer's steps, a rogue reset and a rogue overwrite of the counter.

Seed 004's and 001's correct use and first fault are walked in test_adopting.py as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tally.local.examples import Crash, create_post, like, place_order
from tests.harness.adopting import Adopted
from tests.harness.seeds import (
    LosesResponse,
    UserExists,
    add_user,
    add_user_create_then_update,
    add_user_non_transactional,
    create_counter,
    create_user_metadata,
    like_non_transactional,
    open_issue,
    retried,
    take_number,
)


def kinds(alerts: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return sorted((a["kind"], a.get("number")) for a in alerts)


def set_counter(adopted: Adopted, key: dict[str, Any], attribute: str, value: int) -> None:
    """A rogue's write of the counter: a console edit, a script, a restore."""
    adopted.dynamodb.update_item(
        TableName=adopted.table,
        Key=key,
        UpdateExpression="SET #c = :v",
        ExpressionAttributeNames={"#c": attribute},
        ExpressionAttributeValues={":v": {"N": str(value)}},
    )


# --- seed 000: users numbered in an attribute, LastID on UserMetadata -------------------------


def test_seed_000_users_numbers_checked_through_the_ledger_never_voided(
    adopt: Callable[..., Adopted],
) -> None:
    users = adopt("users", "UsersTable")  # repair = "auto": nothing held may be voided
    client, table = users.dynamodb, users.table
    create_user_metadata(client, table)
    for n in range(12):
        add_user(client, table, f"user{n:02d}")
    with pytest.raises(UserExists):
        add_user(client, table, "user03")  # cancelled: LastID keeps its value
    users.settle()
    assert users.new_alerts() == []

    # Lost response: the transaction committed; the retry finds the user and is cancelled.
    lossy = LosesResponse(client, "transact_write_items")
    with pytest.raises(UserExists):
        retried(lambda: add_user(lossy, table, "Kirk"))
    assert lossy.lost == 1
    users.settle()
    assert users.new_alerts() == []

    # Crash between steps: the non-transactional variant's put fails after the increment
    # (14), and bad solution 2 dies between the increment (15) and the user's update.
    with pytest.raises(client.exceptions.ConditionalCheckFailedException):
        add_user_non_transactional(client, table, "Kirk")
    with pytest.raises(Crash):
        add_user_create_then_update(client, table, "Spock", crash=True)
    users.settle()
    alerts = users.new_alerts()
    assert kinds(alerts) == [("gap", 14), ("gap", 15)]
    assert {a["repair"]["status"] for a in alerts} == {"skipped"}
    held = {i["PK"]: int(i["NumIdentifier"]) for i in users.items() if i["PK"] != "UserMetadata"}
    assert sorted(held.values()) == [0, *range(1, 14)]  # Spock's placeholder 0; no VOID item
    assert all("void" not in item for item in users.items())

    # Rogue overwrite: LastID jumps by 3; the next user takes 19, 16..18 are never used.
    set_counter(users, {"PK": {"S": "UserMetadata"}}, "LastID", 18)
    assert add_user(client, table, "Uhura") == 19
    users.settle()
    assert kinds(users.new_alerts()) == [("gap", 16), ("gap", 17), ("gap", 18)]

    # Rogue reset: LastID back to 0. Alerted at once, then raised over the ledger's members.
    set_counter(users, {"PK": {"S": "UserMetadata"}}, "LastID", 0)
    users.settle()
    alerts = users.new_alerts()
    assert kinds(alerts) == [("counter_behind", None), ("counter_behind", None)]
    assert sorted(a["repair"]["status"] for a in alerts) == ["applied", "skipped"]
    meta = users.dynamodb.get_item(TableName=table, Key={"PK": {"S": "UserMetadata"}})
    assert meta["Item"]["LastID"]["N"] == "19"
    assert all("void" not in item for item in users.items())


# --- seed 001: orders, ADD then put -----------------------------------------------------------


def test_seed_001_orders_lost_response_overwrite_and_reset(adopt: Callable[..., Adopted]) -> None:
    orders = adopt("orders", "OrdersTable")
    client, table = orders.dynamodb, orders.table
    for _ in range(5):
        place_order(client, table)
    orders.settle()
    assert orders.new_alerts() == []

    # Lost response on the ADD: the retry increments again, number 6 is never used.
    lossy = LosesResponse(client, "update_item")
    assert retried(lambda: place_order(lossy, table)) == 7
    # Rogue overwrite: the counter jumps by 3 (8..10 never used), then the next order is 11.
    set_counter(orders, {"pk": {"S": "orderCounter"}}, "count", 10)
    assert place_order(client, table) == 11
    orders.settle()
    assert kinds(orders.new_alerts()) == [("gap", 6), ("gap", 8), ("gap", 9), ("gap", 10)]

    # Rogue reset: the next order would overwrite order 1 (the put has no condition).
    set_counter(orders, {"pk": {"S": "orderCounter"}}, "count", 0)
    orders.settle()
    assert kinds(orders.new_alerts()) == [("counter_behind", None), ("counter_behind", None)]


# --- seed 002 as written: the highest sort key, no counter ------------------------------------


def test_seed_002_members_only_sequence_never_gets_a_counter(
    adopt: Callable[..., Adopted],
) -> None:
    issues = adopt("issues", "IssuesTable")
    projects = issues.table_resource()
    for project, count in (("projectA", 6), ("projectB", 4), ("projectC", 1)):
        for _ in range(count):
            open_issue(projects, project)
    issues.settle()
    assert issues.new_alerts() == []

    # Lost response on the put: the retry reads the new highest and takes the next number.
    lossy = LosesResponse(projects, "put_item")
    assert retried(lambda: open_issue(lossy, "projectC")) == 3
    issues.settle()
    assert issues.new_alerts() == []
    # (No crash between steps: the query writes nothing, the put is the only write.)

    # Rogue overwrite: an import puts projectA's issue 9; 7 and 8 were never handed out.
    projects.put_item(Item={"pk": "projectA", "sk": 9, "priority": "high"})
    # Rogue reset: projectB's last issue deleted; the next writer would reuse number 4.
    projects.delete_item(Key={"pk": "projectB", "sk": 4})
    issues.settle()
    alerts = issues.new_alerts()
    assert sorted((a["key"]["pk"], a["kind"], a["number"]) for a in alerts) == [
        ("projectA", "gap", 7),
        ("projectA", "gap", 8),
        ("projectB", "gap", 4),
    ]
    assert all(int(item["sk"]) > 0 for item in issues.items())  # no counter item created


# --- seed 003: optimistic locking, the counter holds the next free number ---------------------


def test_seed_003_next_free_counter(adopt: Callable[..., Adopted]) -> None:
    numbers = adopt("counter", "CounterTable")
    client, table = numbers.dynamodb, numbers.table
    create_counter(client, table)
    assert [take_number(client, table) for _ in range(10)] == list(range(10))
    numbers.settle()
    assert numbers.new_alerts() == []  # counter 10 = highest 9 + 1: nothing to alert or void

    # Lost response on the fenced ADD: the retry locks 11, number 10 is never used.
    lossy = LosesResponse(client, "update_item")
    assert retried(lambda: take_number(lossy, table)) == 11
    # Crash between the lock and the item: 12 is never used.
    with pytest.raises(Crash):
        take_number(client, table, crash=True)
    # Rogue overwrite: the counter jumps by 3; 13..15 are never used.
    set_counter(numbers, {"pk": {"S": "counter"}}, "count_value", 16)
    assert take_number(client, table) == 16
    numbers.settle()
    assert kinds(numbers.new_alerts()) == [("gap", n) for n in (10, 12, 13, 14, 15)]

    set_counter(numbers, {"pk": {"S": "counter"}}, "count_value", 0)
    numbers.settle()
    alerts = numbers.new_alerts()
    assert kinds(alerts) == [("counter_behind", None), ("counter_behind", None)]
    assert max(a["actual"] for a in alerts) == 17  # the next free number after item 16


# --- seed 004: likes in one transaction -------------------------------------------------------


def test_seed_004_likes_lost_response_crash_reset_and_overwrite(
    adopt: Callable[..., Adopted],
) -> None:
    social = adopt("social", "SocialTable")
    client, table = social.dynamodb, social.table
    for post in ("POST#a", "POST#b", "POST#c", "POST#d"):
        create_post(client, table, post)
        for user in ("u1", "u2", "u3"):
            like(client, table, post, user)

    # Lost response: the transaction committed; the retry is cancelled by the like's guard.
    lossy = LosesResponse(client, "transact_write_items")
    with pytest.raises(client.exceptions.TransactionCanceledException):
        retried(lambda: like(lossy, table, "POST#a", "u4"))
    social.settle()
    assert social.new_alerts() == []

    # Crash between the like and its count (the variant the article warns against).
    with pytest.raises(Crash):
        like_non_transactional(client, table, "POST#b", "u9", crash=True)
    set_counter(social, {"PK": {"S": "POST#c"}, "SK": {"S": "META"}}, "likeTally", 0)
    set_counter(social, {"PK": {"S": "POST#d"}, "SK": {"S": "META"}}, "likeTally", 99)
    social.settle()
    alerts = social.new_alerts()
    found = sorted((a["key"]["PK"], a["kind"], a["stored"], a["actual"]) for a in alerts)
    assert found == [
        ("POST#b", "drift", 3, 4),
        ("POST#c", "drift", 0, 3),
        ("POST#d", "drift", 99, 3),
    ]


def test_seed_000_full_audit_rebuilds_the_ledger_and_finds_a_user_deleted_unseen(
    adopt: Callable[..., Adopted],
) -> None:
    users = adopt("users", "UsersTable")
    client, table = users.dynamodb, users.table
    create_user_metadata(client, table)
    for n in range(6):
        add_user(client, table, f"user{n:02d}")
    users.settle()
    assert users.new_alerts() == []

    # The ledger lost (or a table whose users predate the reconciler): every held number
    # would read as a gap unless the audit rebuilds the ledger from its scan first.
    audit, ledger_pk = users.stack.audit_table_name, 'LEDGER#user-ids#{"PK":"UserMetadata"}'

    def ledger() -> list[dict[str, Any]]:
        return users.dynamodb.query(
            TableName=audit,
            KeyConditionExpression="PK = :pk",
            ExpressionAttributeValues={":pk": {"S": ledger_pk}},
            ConsistentRead=True,
        )["Items"]

    entries = ledger()
    assert len(entries) == 6
    for entry in entries:
        client.delete_item(TableName=audit, Key={"PK": entry["PK"], "SK": entry["SK"]})
    code, out = users.tally("audit", "--json")
    assert (code, json.loads(out)["findings"]) == (0, {})
    assert len(ledger()) == 6

    # A user deleted while no stream reached the ledger: the audit drops the entry after a
    # consistent read of the user, and the freed number is a gap (alert-only: never voided).
    client.delete_item(TableName=table, Key={"PK": {"S": "User#user02"}})
    code, out = users.tally("audit", "--json", "--repair")
    assert (code, json.loads(out)["findings"]) == (1, {"gap": 1})
    assert sorted(int(e["number"]["N"]) for e in ledger() if e["held"]["BOOL"]) == [1, 2, 4, 5, 6]
    held = sorted(int(i["NumIdentifier"]) for i in users.items() if i["PK"] != "UserMetadata")
    assert held == [1, 2, 4, 5, 6]

    # The same through the stream: a user deleted while LastID stands still frees its number.
    users.new_alerts()
    client.delete_item(TableName=table, Key={"PK": {"S": "User#user04"}})
    users.settle()
    assert kinds(users.new_alerts()) == [("gap", 5)]


MEMBERS_ONLY_USERS = """
[table]
partition_key = "PK"

[[rules]]
name = "user-ids"
kind = "sequence"
parent = { PK = "UserMetadata" }
counter_holds = "none"
members = { layout = "attribute", key = { PK = "User#*" }, number = "NumIdentifier" }
grace_seconds = 2
repair = "alert"
"""


def test_a_members_only_ledger_judges_the_highest_number_its_rebuild_dropped(
    adopt: Callable[..., Adopted], tmp_path: Path
) -> None:
    """No counter: the sequence ends at its highest member. The highest user deleted while no
    stream reached the ledger is still a gap for the audit (the next writer would reuse it)."""
    rules = tmp_path / "rules.toml"
    rules.write_text(MEMBERS_ONLY_USERS)
    users = adopt("users", "UsersTable", rules=rules)
    client, table = users.dynamodb, users.table
    for number in range(1, 6):
        item = {"PK": {"S": f"User#u{number}"}, "NumIdentifier": {"N": str(number)}}
        client.put_item(TableName=table, Item=item)
    users.settle()
    assert users.new_alerts() == []
    assert users.items() and all(i["PK"] != "UserMetadata" for i in users.items())

    client.delete_item(TableName=table, Key={"PK": {"S": "User#u5"}})
    code, out = users.tally("audit", "--json")
    assert (code, json.loads(out)["findings"]) == (1, {"gap": 1})
