"""The reconciler on DynamoDB Local's real stream, through the real handlers."""

from __future__ import annotations

import copy
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest

from tally.rules import load_rules
from tally.writers import SequenceAllocator, TallyWriter
from tests.integration.conftest import RULES_FILE, Stack

RULES = load_rules(RULES_FILE)
POST = {"PK": "POST#a91f", "SK": "META"}


def writer(stack: Stack) -> TallyWriter:
    return TallyWriter(stack.dynamodb, stack.table, RULES)


def likes(stack: Stack, post: str = "POST#a91f") -> int:
    pages = stack.dynamodb.get_paginator("query").paginate(
        TableName=stack.table,
        KeyConditionExpression="PK = :pk AND begins_with(SK, :p)",
        ExpressionAttributeValues={":pk": {"S": post}, ":p": {"S": "LIKE#"}},
        ConsistentRead=True,
        Select="COUNT",
    )
    return sum(page["Count"] for page in pages)


def kinds(alerts: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((a["kind"], a["repair"]["status"]) for a in alerts)


def test_balanced_writes_through_the_writers_raise_nothing(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    stack.put({"PK": "ORDER#17", "SK": "META", "total": 0})
    w = writer(stack)
    for user in range(5):
        w.add_child({"PK": "POST#a91f", "SK": f"LIKE#USER#{user}"})
    w.remove_child({"PK": "POST#a91f", "SK": "LIKE#USER#0"})
    w.add_child({"PK": "ORDER#17", "SK": "LINE#1"}, {"amount": Decimal("19.99")})
    w.change_amount({"PK": "ORDER#17", "SK": "LINE#1"}, Decimal("5.01"))
    stack.settle()
    assert stack.alerts() == []
    assert stack.audit.log.findings() == []
    assert all(r["batchItemFailures"] == [] for r in stack.responses)


def test_a_rogue_counter_overwrite_is_found_repaired_and_logged(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    w = writer(stack)
    for user in range(3):
        w.add_child({"PK": "POST#a91f", "SK": f"LIKE#USER#{user}"})
    stack.pump()
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key={"PK": {"S": "POST#a91f"}, "SK": {"S": "META"}},
        UpdateExpression="SET likeTally = :v",
        ExpressionAttributeValues={":v": {"N": "100"}},
    )
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["key"], alert["stored"], alert["actual"]) == (
        "drift",
        POST,
        100,
        3,
    )
    assert alert["repair"]["status"] == "applied"
    assert alert["evidence"][0]["old"] == 3 and alert["evidence"][0]["new"] == 100
    assert "likedAt" not in str(alert["evidence"])
    assert stack.item("POST#a91f", "META")["likeTally"] == 3  # type: ignore[index]
    [repair] = stack.audit.log.repairs()
    assert (repair["before"], repair["after"]) == (100, 3)


def test_a_child_written_without_its_counter_is_drift(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    stack.put({"PK": "POST#a91f", "SK": "LIKE#USER#rogue"})
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 0, 1)
    assert stack.item("POST#a91f", "META")["likeTally"] == 1  # type: ignore[index]


def test_a_sum_rule_in_alert_mode_reports_but_does_not_repair(stack: Stack) -> None:
    stack.put({"PK": "ORDER#17", "SK": "META", "total": Decimal("0")})
    stack.put({"PK": "ORDER#17", "SK": "LINE#1", "amount": Decimal("0.10")})
    stack.put({"PK": "ORDER#17", "SK": "LINE#2", "amount": Decimal("0.20")})
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["actual"], alert["repair"]["status"]) == (
        "drift",
        "0.3",
        "skipped",
    )
    assert stack.item("ORDER#17", "META")["total"] == 0  # type: ignore[index]


def test_seed_style_writers_without_revision_need_two_agreeing_reads(stack: Stack) -> None:
    stack.put({"PK": "TEAM#1", "SK": "META", "memberCount": 5})
    stack.put({"PK": "TEAM#1", "SK": "MEMBER#ann"})
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 5, 1)
    assert "two agreeing settled reads" in alert["detail"]
    assert stack.item("TEAM#1", "META")["memberCount"] == 1  # type: ignore[index]


def test_a_string_in_a_counter_is_an_invalid_counter_finding_not_a_crash(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    writer(stack).add_child({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    stack.put({**POST, "likeTally": "lots"})
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == (
        "invalid_counter",
        "string of 4 characters",  # never the value itself: it may be personal data
        1,
    )
    assert all(r["batchItemFailures"] == [] for r in stack.responses)
    assert alert["repair"]["status"] == "skipped"  # a repair writes only over a number
    assert stack.item("POST#a91f", "META")["likeTally"] == "lots"  # type: ignore[index]


def test_deleting_a_parent_with_children_is_an_orphans_finding(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    w = writer(stack)
    w.add_child({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    w.add_child({"PK": "POST#a91f", "SK": "LIKE#USER#2"})
    stack.delete("POST#a91f", "META")
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["actual"], alert["repair"]["status"]) == ("orphans", 2, "skipped")
    assert likes(stack) == 2


def test_ttl_expiry_of_a_child_is_reported_as_ttl_removal(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    writer(stack).add_child({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    stack.pump()
    stack.delete("POST#a91f", "LIKE#USER#1")
    [removal] = stack.records()
    removal["userIdentity"] = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    stack.deliver([removal])
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("ttl_removal", 1, 0)
    assert stack.item("POST#a91f", "META")["likeTally"] == 0  # type: ignore[index]


def test_ttl_expiry_on_a_decrement_rule_is_applied_exactly_once(stack: Stack) -> None:
    stack.put({"PK": "USER#1", "SK": "META", "activeSessions": 0})
    w = writer(stack)
    w.add_child({"PK": "USER#1", "SK": "SESSION#a"})
    w.add_child({"PK": "USER#1", "SK": "SESSION#b"})
    stack.pump()
    stack.delete("USER#1", "SESSION#a")
    [removal] = stack.records()
    removal["userIdentity"] = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    stack.deliver([removal])
    stack.deliver([removal])  # redelivered
    stack.settle()
    assert stack.item("USER#1", "META")["activeSessions"] == 1  # type: ignore[index]
    assert stack.alerts() == []


def test_a_client_crash_between_increment_and_put_becomes_a_voided_gap(stack: Stack) -> None:
    counter = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
    allocator = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    allocator.allocate(counter, strategy="atomic")
    stack.dynamodb.update_item(  # the increment of a client that then crashed
        TableName=stack.table,
        Key={"PK": {"S": "PROJECT#A"}, "SK": {"S": "COUNTER#ISSUE"}},
        UpdateExpression="ADD lastIssue :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
    allocator.allocate(counter, strategy="atomic")
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["number"], alert["repair"]["status"]) == ("gap", 2, "applied")
    assert stack.item("PROJECT#A", "ISSUE#0000000002")["void"] is True  # type: ignore[index]
    with pytest.raises(stack.dynamodb.exceptions.ConditionalCheckFailedException):
        stack.dynamodb.put_item(  # the crashed client, back late, fails loudly
            TableName=stack.table,
            Item={"PK": {"S": "PROJECT#A"}, "SK": {"S": "ISSUE#0000000002"}},
            ConditionExpression="attribute_not_exists(PK)",
        )
    assert stack.audit.watermarks.watermark("issue-numbers", counter) == 3


def test_a_counter_reset_to_zero_is_counter_behind_and_is_raised_back(stack: Stack) -> None:
    counter = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
    allocator = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(4):
        allocator.allocate(counter)
    stack.settle()
    stack.put({**counter, "lastIssue": 0})  # a rogue reset (seed 003)
    stack.settle()
    # Alerted as the stream shows it going down, then again when the recheck repairs it.
    seen, raised = stack.alerts()
    assert (seen["kind"], seen["stored"], seen["actual"]) == ("counter_behind", 0, 4)
    assert seen["repair"]["status"] == "skipped"
    assert (raised["kind"], raised["stored"], raised["actual"]) == ("counter_behind", 0, 4)
    assert raised["repair"]["status"] == "applied"
    assert stack.item("PROJECT#A", "COUNTER#ISSUE")["lastIssue"] == 4  # type: ignore[index]
    assert allocator.allocate(counter).numbers == (5,)


def test_two_users_holding_one_number_is_a_duplicate(stack: Stack) -> None:
    counter = {"PK": "UserMetadata", "SK": "META"}
    allocator = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    allocator.allocate(counter, member_key={"PK": "User#Kirk", "SK": "PROFILE"})
    stack.put({"PK": "User#Spock", "SK": "PROFILE", "seqName": "user-numbers", "NumIdentifier": 1})
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["number"], alert["repair"]["status"]) == (
        "duplicate",
        1,
        "skipped",
    )


def test_the_same_batch_delivered_twice_alerts_and_repairs_once(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 7})
    stack.put({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    records = stack.records()
    stack.deliver(copy.deepcopy(records))
    stack.deliver(copy.deepcopy(records))
    stack.settle()
    alerts = stack.alerts()
    assert kinds(alerts) == [("drift", "applied")]
    assert len(stack.audit.log.repairs()) == 1
    assert stack.item("POST#a91f", "META")["likeTally"] == 1  # type: ignore[index]


def test_a_transaction_split_across_two_batches_is_not_drift(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    stack.pump()
    w = writer(stack)
    for user in range(4):
        w.add_child({"PK": "POST#a91f", "SK": f"LIKE#USER#{user}"})
    stack.settle(batch_size=1)  # every child and every counter bump in its own batch
    assert stack.alerts() == []
    assert stack.audit.log.findings() == []


def test_threads_hammering_a_parent_while_it_is_verified_see_no_false_drift(
    stack: Stack,
) -> None:
    stack.put({**POST, "likeTally": 0})
    w = writer(stack)
    done = threading.Event()

    def hammer(thread: int) -> None:
        rng = random.Random(thread)
        for _ in range(25):
            key = {"PK": "POST#a91f", "SK": f"LIKE#USER#{rng.randrange(30)}"}
            (w.add_child if rng.random() < 0.6 else w.remove_child)(key)

    def verify_continuously() -> None:
        while not done.is_set():
            stack.pump(batch_size=7)

    verifier = threading.Thread(target=verify_continuously)
    verifier.start()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(hammer, range(8)))
    done.set()
    verifier.join()
    stack.settle(batch_size=7)
    assert stack.alerts() == []
    assert stack.item("POST#a91f", "META")["likeTally"] == likes(stack)


def test_a_repair_never_clobbers_a_concurrent_legitimate_write(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 50})  # drifted: no children yet
    w = writer(stack)
    done = threading.Event()

    def verify_continuously() -> None:
        while not done.is_set():
            stack.pump(batch_size=5)

    verifier = threading.Thread(target=verify_continuously)
    verifier.start()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: w.add_child({"PK": "POST#a91f", "SK": f"LIKE#{n}"}), range(40)))
    done.set()
    verifier.join()
    stack.settle()
    assert stack.item("POST#a91f", "META")["likeTally"] == likes(stack) == 40
    assert [a["kind"] for a in stack.alerts()] == ["drift"]


def test_malformed_and_unknown_records_never_fail_the_batch(stack: Stack) -> None:
    stack.put({"PK": "NOTE#1", "SK": "X", "body": "unrelated"})
    stack.put({**POST, "likeTally": {"not": "a number"}})
    records = stack.records()
    records.append({"eventID": "broken", "eventName": "INSERT", "dynamodb": {}})
    response = stack.deliver(records)
    assert response["batchItemFailures"] == []
    stack.settle()
    assert [a["kind"] for a in stack.alerts()] == ["invalid_counter"]


@pytest.mark.parametrize(
    ("variable", "status"), [("REPAIRS_ENABLED", "disabled"), ("DRY_RUN", "dry_run")]
)
def test_the_kill_switch_and_dry_run_write_nothing(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, variable: str, status: str
) -> None:
    monkeypatch.setenv(variable, "false" if variable == "REPAIRS_ENABLED" else "true")
    stack.put({**POST, "likeTally": 9})
    stack.put({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["repair"]["status"]) == ("drift", status)
    assert stack.item("POST#a91f", "META")["likeTally"] == 9  # type: ignore[index]
    assert stack.audit.log.repairs() == []


def test_an_unrepaired_finding_redelivered_alerts_once(stack: Stack) -> None:
    stack.put({"PK": "ORDER#17", "SK": "META", "total": Decimal("5")})
    stack.put({"PK": "ORDER#17", "SK": "LINE#1", "amount": Decimal("2.50")})
    records = stack.records()
    for _ in range(3):
        assert stack.deliver(copy.deepcopy(records))["batchItemFailures"] == []
    stack.settle()  # a sum's remainder is carried, then recounted after the window
    alerts = stack.alerts()
    assert kinds(alerts) == [("drift", "skipped")]
    assert alerts[0]["actual"] == "2.5"
    assert len(stack.audit.log.findings()) == 1
