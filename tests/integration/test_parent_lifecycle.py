"""Parents are deleted and keys reused: nothing is written under a parent that is gone.

Each case is a foreign application's raw boto3 writes against DynamoDB Local, verified by
the real stream and recheck handlers. Whatever the application deletes, the reconciler may
alert (once, and only for what persists), but it never writes under a parent that does not
exist when its write commits.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tally.reconciler import runtime
from tally.rules import REPAIR_MARKER, load_rules
from tally.writers import SequenceAllocator, TallyWriter
from tests.integration.conftest import RULES_FILE, Stack, _clear_caches
from tests.utils import deserialize, serialize

RULES = load_rules(RULES_FILE)
PROJECT = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
POST = {"PK": "POST#a91f", "SK": "META"}
ORDER = {"PK": "ORDER#17", "SK": "META"}


def collection(stack: Stack, pk: str) -> list[dict[str, Any]]:
    """Every item under partition key ``pk``, read consistently."""
    pages = stack.dynamodb.get_paginator("query").paginate(
        TableName=stack.table,
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": pk}},
        ConsistentRead=True,
    )
    return [deserialize(item) for page in pages for item in page["Items"]]


def reconciler_writes(stack: Stack) -> list[dict[str, Any]]:
    """Items in the table that carry the reconciler's marker or are VOID tombstones."""
    pages = stack.dynamodb.get_paginator("scan").paginate(
        TableName=stack.table, ConsistentRead=True
    )
    items = [deserialize(item) for page in pages for item in page["Items"]]
    return [item for item in items if REPAIR_MARKER in item or item.get("void")]


def project_with_issues(stack: Stack, issues: int = 3) -> list[dict[str, Any]]:
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(issues):
        numbers.allocate(PROJECT, attributes={"title": "an issue"})
    stack.settle()
    assert stack.alerts() == []
    keys = [item for item in collection(stack, "PROJECT#A")]
    assert len(keys) == issues + 1
    return [{"PK": item["PK"], "SK": item["SK"]} for item in keys]


def post_with_likes(stack: Stack, likes: int) -> None:
    stack.put({**POST, "likeTally": 0})
    w = TallyWriter(stack.dynamodb, stack.table, RULES)
    for user in range(likes):
        w.add_child({"PK": "POST#a91f", "SK": f"LIKE#USER#{user}"})
    stack.settle()
    assert stack.alerts() == []


def test_a_project_deleted_with_its_issues_in_one_batch_write_is_no_gap(stack: Stack) -> None:
    keys = project_with_issues(stack)
    stack.dynamodb.batch_write_item(
        RequestItems={stack.table: [{"DeleteRequest": {"Key": serialize(k)}} for k in keys]}
    )
    stack.settle()
    assert stack.alerts() == []
    assert collection(stack, "PROJECT#A") == []


def test_a_project_deleted_with_its_issues_in_one_transaction_is_no_gap(stack: Stack) -> None:
    keys = project_with_issues(stack)
    stack.dynamodb.transact_write_items(
        TransactItems=[{"Delete": {"TableName": stack.table, "Key": serialize(k)}} for k in keys]
    )
    stack.settle()
    assert stack.alerts() == []
    assert collection(stack, "PROJECT#A") == []


def test_a_project_counter_deleted_and_its_issues_a_moment_later_is_no_gap(stack: Stack) -> None:
    keys = project_with_issues(stack)
    stack.delete(PROJECT["PK"], PROJECT["SK"])
    stack.pump()
    for key in keys:
        if key != PROJECT:
            stack.delete(key["PK"], key["SK"])
    stack.settle()
    assert stack.alerts() == []
    assert collection(stack, "PROJECT#A") == []


def test_a_project_deleted_and_its_key_reused_numbers_from_one_again(stack: Stack) -> None:
    keys = project_with_issues(stack)
    stack.dynamodb.batch_write_item(
        RequestItems={stack.table: [{"DeleteRequest": {"Key": serialize(k)}} for k in keys]}
    )
    stack.settle()
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(2):
        numbers.allocate(PROJECT, attributes={"title": "a new life"})
    stack.settle()
    assert stack.alerts() == []
    assert sorted(i["SK"] for i in collection(stack, "PROJECT#A")) == [
        "COUNTER#ISSUE",
        "ISSUE#0000000001",
        "ISSUE#0000000002",
    ]


def test_a_sample_gap_event_on_an_empty_table_writes_nothing(stack: Stack) -> None:
    """A recheck for a project the table never held (a sample event, a stale message)."""
    from tally.reconciler.report.rechecks import Recheck, RecheckQueue

    RecheckQueue(stack.sqs, stack.recheck_queue).schedule(
        Recheck("issue-numbers", PROJECT, 4, "a sample event"), 0
    )
    stack.settle()
    assert stack.alerts() == []
    assert collection(stack, "PROJECT#A") == []


def test_a_void_never_lands_under_a_counter_deleted_before_it_commits(stack: Stack) -> None:
    """The project goes away between the recheck's reads and its VOID: nothing is written."""
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(3):
        numbers.allocate(PROJECT, attributes={"title": "an issue"})
    stack.delete("PROJECT#A", "ISSUE#0000000002")  # a rogue delete: a real gap
    records = stack.records()
    client = runtime._clients()[0]

    def delete_project(**_: Any) -> None:
        client.meta.events.unregister("before-call.dynamodb.TransactWriteItems", delete_project)
        for item in collection(stack, "PROJECT#A"):
            stack.delete(item["PK"], item["SK"])

    client.meta.events.register("before-call.dynamodb.TransactWriteItems", delete_project)
    stack.deliver(records)
    stack.settle()
    assert collection(stack, "PROJECT#A") == []
    assert reconciler_writes(stack) == []


def test_a_repair_never_creates_a_post_deleted_before_it_commits(stack: Stack) -> None:
    """Drift judged on a post that is deleted before the repair commits: no item appears.

    The post was put by a foreign writer without counter or revision, so a fence on their
    absence alone would hold on a deleted item too (and UpdateItem would create it).
    """
    stack.put(POST)
    stack.pump()  # the post stood before the likes arrive
    stack.put({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    stack.put({"PK": "POST#a91f", "SK": "LIKE#USER#2"})
    records = stack.records()
    client = runtime._clients()[0]

    def delete_post(**_: Any) -> None:
        client.meta.events.unregister("before-call.dynamodb.TransactWriteItems", delete_post)
        stack.delete(POST["PK"], POST["SK"])

    client.meta.events.register("before-call.dynamodb.TransactWriteItems", delete_post)
    stack.deliver(records)
    assert stack.item(POST["PK"], POST["SK"]) is None
    assert reconciler_writes(stack) == []


def test_likes_a_cleanup_deletes_a_moment_after_their_post_raise_no_alert(stack: Stack) -> None:
    post_with_likes(stack, 5)
    stack.delete(POST["PK"], POST["SK"])
    stack.pump()  # the post's removal: its likes are left for a moment
    assert stack.alerts() == []
    for user in range(5):
        stack.delete("POST#a91f", f"LIKE#USER#{user}")
    stack.settle()
    assert stack.alerts() == []
    assert collection(stack, "POST#a91f") == []


def test_likes_left_for_good_are_one_orphans_alert_and_no_write(stack: Stack) -> None:
    post_with_likes(stack, 3)
    stack.delete(POST["PK"], POST["SK"])
    stack.settle()
    stack.run_rechecks()
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["actual"], alert["repair"]["status"]) == ("orphans", 3, "skipped")
    assert stack.item(POST["PK"], POST["SK"]) is None
    assert reconciler_writes(stack) == []


def test_a_post_deleted_with_its_likes_and_its_key_reused_is_clean(stack: Stack) -> None:
    post_with_likes(stack, 3)
    keys = [POST] + [{"PK": "POST#a91f", "SK": f"LIKE#USER#{u}"} for u in range(3)]
    stack.dynamodb.batch_write_item(
        RequestItems={stack.table: [{"DeleteRequest": {"Key": serialize(k)}} for k in keys]}
    )
    stack.settle()
    post_with_likes(stack, 2)
    assert stack.alerts() == []
    assert stack.item(POST["PK"], POST["SK"])["likeTally"] == 2  # type: ignore[index]


def test_an_order_deleted_with_its_lines_is_clean(stack: Stack) -> None:
    stack.put({**ORDER, "total": 0})
    w = TallyWriter(stack.dynamodb, stack.table, RULES)
    w.add_child({"PK": "ORDER#17", "SK": "LINE#1"}, {"amount": Decimal("19.99")})
    w.add_child({"PK": "ORDER#17", "SK": "LINE#2"}, {"amount": Decimal("5.01")})
    stack.settle()
    keys = [ORDER, {"PK": "ORDER#17", "SK": "LINE#1"}, {"PK": "ORDER#17", "SK": "LINE#2"}]
    stack.dynamodb.transact_write_items(
        TransactItems=[{"Delete": {"TableName": stack.table, "Key": serialize(k)}} for k in keys]
    )
    stack.settle()
    assert stack.alerts() == []
    assert collection(stack, "ORDER#17") == []


@pytest.mark.parametrize("recreated", [False, True])
def test_a_post_deleted_while_its_recheck_is_pending_gets_no_write(
    stack: Stack, recreated: bool
) -> None:
    """A carry or deferred recheck outlives its parent: it judges the table as it is then."""
    post_with_likes(stack, 2)
    from tally.reconciler.report.rechecks import Recheck, RecheckQueue

    RecheckQueue(stack.sqs, stack.recheck_queue).schedule(
        Recheck("likes", POST, 0, "parent kept changing during recount"), 0
    )
    keys = [POST] + [{"PK": "POST#a91f", "SK": f"LIKE#USER#{u}"} for u in range(2)]
    stack.dynamodb.batch_write_item(
        RequestItems={stack.table: [{"DeleteRequest": {"Key": serialize(k)}} for k in keys]}
    )
    if recreated:
        stack.put({**POST, "likeTally": 0})
    stack.settle()
    assert stack.alerts() == []
    assert reconciler_writes(stack) == []
    expected = [{**POST, "likeTally": 0}] if recreated else []
    assert collection(stack, "POST#a91f") == expected


def test_a_project_reused_before_its_recheck_never_voids_the_new_lifes_numbers(
    stack: Stack,
) -> None:
    """The deletion's recheck runs after the key was used again and a new allocation of
    number 3 is in flight (counter moved, member not written yet): no VOID under it."""
    keys = project_with_issues(stack)
    stack.dynamodb.batch_write_item(
        RequestItems={stack.table: [{"DeleteRequest": {"Key": serialize(k)}} for k in keys]}
    )
    stack.pump()  # the deletion: its recheck is queued, not run yet
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(2):
        numbers.allocate(PROJECT, attributes={"title": "a new life"})
    stack.dynamodb.update_item(  # a third allocation in flight: counter first, member next
        TableName=stack.table,
        Key=serialize(PROJECT),
        UpdateExpression="ADD lastIssue :one",
        ExpressionAttributeValues=serialize({":one": 1}),
    )
    stack.run_rechecks()
    assert stack.item("PROJECT#A", "ISSUE#0000000003") is None
    stack.put({"PK": "PROJECT#A", "SK": "ISSUE#0000000003", "title": "a new life"})
    stack.settle()
    assert stack.alerts() == []
    assert reconciler_writes(stack) == []


TTL = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}


def test_a_ttl_expiry_never_decrements_a_parent_made_again(stack: Stack) -> None:
    """Sessions expire by TTL around their user's deletion and re-creation, in one batch:
    the new user's counter owes the old sessions nothing, and nothing is written to it."""
    user = {"PK": "USER#u1", "SK": "META"}
    stack.put({**user, "activeSessions": 0})
    w = TallyWriter(stack.dynamodb, stack.table, RULES)
    for session in ("s1", "s2"):
        w.add_child({"PK": "USER#u1", "SK": f"SESSION#{session}"})
    stack.settle()
    stack.delete("USER#u1", "SESSION#s1")
    stack.delete("USER#u1", "META")
    stack.delete("USER#u1", "SESSION#s2")
    stack.put({**user, "activeSessions": 0})
    records = stack.records()
    for record in records:
        if record["dynamodb"]["Keys"]["SK"]["S"].startswith("SESSION#"):
            record["userIdentity"] = TTL
    stack.deliver(records)
    stack.settle()
    assert stack.alerts() == []
    assert stack.item("USER#u1", "META") == {**user, "activeSessions": 0}


def test_a_ttl_expiry_delivered_after_its_parent_was_made_again_is_not_applied(
    stack: Stack,
) -> None:
    user = {"PK": "USER#u1", "SK": "META"}
    stack.put({**user, "activeSessions": 0})
    TallyWriter(stack.dynamodb, stack.table, RULES).add_child({"PK": "USER#u1", "SK": "SESSION#s1"})
    stack.settle()
    stack.delete("USER#u1", "SESSION#s1")
    expired = stack.records()
    for record in expired:
        record["userIdentity"] = TTL
    stack.delete("USER#u1", "META")
    stack.put({**user, "activeSessions": 0})
    stack.pump()  # the user's new life first: the stream lagged behind the expiry
    stack.deliver(expired)
    stack.settle()
    assert stack.alerts() == []
    assert stack.item("USER#u1", "META") == {**user, "activeSessions": 0}


def test_a_deletion_split_by_a_batch_boundary_keeps_no_horizon_for_the_next_life(
    stack: Stack,
) -> None:
    keys = project_with_issues(stack)
    stack.dynamodb.batch_write_item(
        RequestItems={stack.table: [{"DeleteRequest": {"Key": serialize(k)}} for k in keys]}
    )
    records = stack.records()
    last = [r for r in records if r["dynamodb"]["Keys"]["SK"]["S"] == "ISSUE#0000000003"]
    stack.deliver(last)  # the boundary: issue 3's removal alone, the counter's in the next
    stack.deliver([r for r in records if r not in last])
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(2):
        numbers.allocate(PROJECT, attributes={"title": "a new life"})
    stack.dynamodb.update_item(  # number 3 in flight: the counter moved, the member not yet
        TableName=stack.table,
        Key=serialize(PROJECT),
        UpdateExpression="ADD lastIssue :one",
        ExpressionAttributeValues=serialize({":one": 1}),
    )
    stack.run_rechecks()
    assert stack.item("PROJECT#A", "ISSUE#0000000003") is None
    stack.put({"PK": "PROJECT#A", "SK": "ISSUE#0000000003", "title": "a new life"})
    stack.settle()
    assert stack.alerts() == []
    assert reconciler_writes(stack) == []


def test_a_members_only_sequence_deleted_leaves_its_void_no_anchor(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issues 1, 3, 4 (2 voided as a gap), then the project is deleted: the VOID the
    reconciler wrote is no member that keeps the sequence alive."""
    rules = tmp_path / "rules.toml"
    rules.write_text(MEMBERS_ONLY)
    monkeypatch.setenv("RULES_FILE", str(rules))
    _clear_caches()
    for number in (1, 3, 4):
        stack.put({"PK": "BOARD#b", "SK": f"TASK#{number:010d}"})
    stack.settle()
    [gap] = stack.alerts()
    assert (gap["kind"], gap["number"], gap["repair"]["status"]) == ("gap", 2, "applied")
    for number in (1, 3, 4):
        stack.delete("BOARD#b", f"TASK#{number:010d}")
    stack.settle()
    assert stack.alerts() == []
    assert [item["SK"] for item in collection(stack, "BOARD#b")] == ["TASK#0000000002"]


MEMBERS_ONLY = """
[table]
partition_key = "PK"
sort_key = "SK"

[[rules]]
name = "tasks"
kind = "sequence"
parent = { PK = "BOARD#*", SK = "COUNTER#TASK" }
counter_holds = "none"
members = { layout = "collection", SK = "TASK#*", width = 10 }
grace_seconds = 0
orphan_grace_seconds = 1
repair = "auto"
"""


def order_with_lines(stack: Stack) -> None:
    stack.put({**ORDER, "total": 0})
    w = TallyWriter(stack.dynamodb, stack.table, RULES)
    w.add_child({"PK": "ORDER#17", "SK": "LINE#1"}, {"amount": Decimal("19.99")})
    w.add_child({"PK": "ORDER#17", "SK": "LINE#2"}, {"amount": Decimal("5.01")})
    stack.settle()
    assert stack.alerts() == []


def test_an_order_whose_lines_go_first_and_the_order_next_raises_no_alert(stack: Stack) -> None:
    """A deletion that is no transaction: the lines, the stream handler, then the order."""
    order_with_lines(stack)
    stack.delete("ORDER#17", "LINE#1")
    stack.delete("ORDER#17", "LINE#2")
    stack.pump()  # the order is left with its total and no line, for a moment
    stack.delete("ORDER#17", "META")
    stack.settle()
    assert stack.alerts() == []
    assert collection(stack, "ORDER#17") == []


def test_an_order_left_without_its_lines_is_drift_after_the_grace(stack: Stack) -> None:
    order_with_lines(stack)
    stack.delete("ORDER#17", "LINE#1")
    stack.delete("ORDER#17", "LINE#2")
    stack.pump()
    assert stack.alerts() == []
    stack.settle()  # the second look, a grace later
    [alert] = stack.alerts()
    assert (alert["kind"], Decimal(str(alert["stored"])), alert["actual"]) == (
        "drift",
        Decimal("25.00"),
        0,
    )


def test_a_rogue_count_on_a_post_that_already_stood_is_alerted_by_its_batch(stack: Stack) -> None:
    """An overwrite of a post that stood is judged by the batch that shows it."""
    post_with_likes(stack, 2)
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key=serialize(POST),
        UpdateExpression="SET likeTally = :v",
        ExpressionAttributeValues={":v": {"N": "40"}},
    )
    stack.pump()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 40, 2)
