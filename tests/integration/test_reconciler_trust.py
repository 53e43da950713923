"""Regressions: the reconciler against writers it did not write, faults, races and forgeries.

Each test drives DynamoDB Local's real stream through the real handlers.
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest

from tally.audit.full_audit import full_audit
from tally.core.settings import settings
from tally.handlers import reconciler as reconciler_handler
from tally.local.runner import LocalContext
from tally.reconciler import runtime
from tally.reconciler.report.rechecks import Recheck
from tally.rules import load_rules
from tally.writers import SequenceAllocator, TallyWriter
from tests.harness.faults import Outage
from tests.integration.conftest import RULES_FILE, Stack

RULES = load_rules(RULES_FILE)
POST = {"PK": "POST#a91f", "SK": "META"}
ORDER = {"PK": "ORDER#17", "SK": "META"}
PROJECT = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
USERS = {"PK": "UserMetadata", "SK": "META"}


def issue(number: int) -> dict[str, str]:
    return {"PK": "PROJECT#A", "SK": f"ISSUE#{number:010d}"}


def item(stack: Stack, key: dict[str, str]) -> dict[str, Any] | None:
    return stack.item(key["PK"], key["SK"])


def likes_writer(stack: Stack) -> TallyWriter:
    return TallyWriter(stack.dynamodb, stack.table, RULES)


def rogue_update(stack: Stack, key: dict[str, str], expression: str, **values: Any) -> None:
    """A client the project did not write: a raw UpdateItem."""
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key={k: {"S": v} for k, v in key.items()},
        UpdateExpression=expression,
        **(
            {"ExpressionAttributeValues": {f":{k}": _av(v) for k, v in values.items()}}
            if values
            else {}
        ),
    )


def _av(value: Any) -> dict[str, Any]:
    return {"N": str(value)} if isinstance(value, int | Decimal) else {"S": str(value)}


def summary(alerts: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((a["kind"], a.get("number"), a["repair"]["status"]) for a in alerts)


# --- 1. one finding, one id --------------------------------------------------------------


def test_two_gaps_give_two_alerts_two_voids_and_the_watermark(stack: Stack) -> None:
    stack.put({**PROJECT, "lastIssue": 4})
    stack.put(issue(1))
    stack.put(issue(4))
    stack.settle()
    alerts = stack.alerts()
    assert summary(alerts) == [("gap", 2, "applied"), ("gap", 3, "applied")]
    assert len({a["finding_id"] for a in alerts}) == 2
    assert item(stack, issue(2))["void"] is True  # type: ignore[index]
    assert item(stack, issue(3))["void"] is True  # type: ignore[index]
    assert stack.audit.watermarks.watermark("issue-numbers", PROJECT) == 4
    assert all(r["batchItemFailures"] == [] for r in stack.responses)


def test_two_duplicated_numbers_give_two_alerts_and_two_findings(stack: Stack) -> None:
    stack.put({**USERS, "LastID": 2})
    for name, number in (("Kirk", 1), ("Spock", 1), ("Uhura", 2), ("Sulu", 2)):
        stack.put(
            {
                "PK": f"User#{name}",
                "SK": "PROFILE",
                "seqName": "user-numbers",
                "NumIdentifier": number,
            }
        )
    stack.settle()
    alerts = stack.alerts()
    assert summary(alerts) == [("duplicate", 1, "skipped"), ("duplicate", 2, "skipped")]
    assert len(stack.audit.log.findings(kind="duplicate")) == 2


# --- 2. no alert lost after a repair commits ---------------------------------------------


def test_an_alert_survives_sns_down_after_the_repair_committed(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    for user in range(3):
        likes_writer(stack).add_child({"PK": "POST#a91f", "SK": f"LIKE#USER#{user}"})
    stack.pump()
    rogue_update(stack, POST, "SET likeTally = :v", v=100)
    records = stack.records()
    outage = Outage(runtime._clients()[1], "Publish", "down")
    first = stack.deliver(copy.deepcopy(records))
    assert first["batchItemFailures"] != []  # the alert is not out yet: Lambda must retry
    assert item(stack, POST)["likeTally"] == 3  # type: ignore[index]
    assert stack.alerts() == []
    outage.heal()
    assert stack.deliver(copy.deepcopy(records))["batchItemFailures"] == []
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 100, 3)
    assert alert["repair"]["status"] == "applied"
    assert stack.deliver(copy.deepcopy(records))["batchItemFailures"] == []
    assert stack.alerts() == []


def test_a_repair_whose_response_was_lost_is_applied_once_and_alerted(stack: Stack) -> None:
    stack.put({"PK": "TEAM#1", "SK": "META", "memberCount": 0})
    stack.put({"PK": "TEAM#1", "SK": "MEMBER#ann"})
    records = stack.records()
    # The repair transaction commits; its response is lost and botocore sends it again.
    outage = Outage(runtime._clients()[0], "TransactWriteItems", "lost", times=1)
    assert stack.deliver(copy.deepcopy(records))["batchItemFailures"] == []
    outage.heal()
    assert outage.failed == 1
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["repair"]["status"]) == ("drift", "applied")
    assert len(stack.audit.log.repairs()) == 1


def test_a_lost_publish_response_is_sent_again_only_by_the_outbox(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 7})
    records = stack.records()
    outage = Outage(runtime._clients()[1], "Publish", "lost")
    assert stack.deliver(copy.deepcopy(records))["batchItemFailures"] != []
    assert outage.calls == 2  # one publish, one outbox flush: no SDK retry fans it out
    outage.heal()
    assert stack.deliver(copy.deepcopy(records))["batchItemFailures"] == []
    stack.settle()
    alerts = stack.alerts()
    # At least once: each lost response was a delivered copy, then one got through. No more.
    assert len(alerts) == outage.calls + 1 == 3
    assert len({a["alert_id"] for a in alerts}) == 1


def test_a_marker_copied_from_a_real_repair_does_not_hide_a_rogue_change(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 5})
    stack.settle()
    assert summary(stack.alerts()) == [("drift", None, "applied")]
    marker = item(stack, POST)["tallyRepair"]  # type: ignore[index]
    rogue_update(stack, POST, "REMOVE tallyRepair")
    rogue_update(stack, POST, "SET tallyRepair = :m, likeTally = :v", m=marker, v=50)
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 50, 0)


# --- 3. the own-write marker cannot be forged --------------------------------------------


def test_a_forged_repair_marker_does_not_hide_a_rogue_counter_change(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    likes_writer(stack).add_child({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    stack.pump()
    rogue_update(stack, POST, "SET likeTally = :v, tallyRepair = :m", v=50, m="forged-1")
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 50, 1)


def test_a_forged_marker_on_a_child_insert_does_not_hide_it(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    stack.pump()
    stack.put({"PK": "POST#a91f", "SK": "LIKE#USER#9", "tallyRepair": "forged-2"})
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 0, 1)


def test_the_reconcilers_own_repair_raises_nothing_further(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 5})
    stack.pump()
    assert summary(stack.alerts()) == [("drift", None, "applied")]
    [repair_record] = stack.records()
    checker = runtime.reconciler()
    assert checker.verify_batch([repair_record]) == []
    assert (checker.stats.own_writes, checker.table.reads.recounts) == (1, 0)
    stack.settle()
    assert stack.alerts() == []
    assert len(stack.audit.log.findings()) == 1


# --- 4. ordinary writes never crash a batch ----------------------------------------------


def test_removing_the_counter_attribute_is_drift_not_a_crash(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    likes_writer(stack).add_child({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    stack.pump()
    rogue_update(stack, POST, "REMOVE likeTally")
    stack.settle()
    assert all(r["batchItemFailures"] == [] for r in stack.responses)
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", None, 1)


def test_a_parent_put_without_its_counter_is_drift_not_a_crash(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 0})
    likes_writer(stack).add_child({"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    stack.pump()
    stack.put({**POST, "body": "edited"})
    stack.settle()
    assert all(r["batchItemFailures"] == [] for r in stack.responses)
    assert [a["kind"] for a in stack.alerts()] == ["drift"]


@pytest.mark.parametrize("jump", [1_732_000_000, Decimal("1E+125")])
def test_a_huge_sequence_jump_is_one_summarised_gap(stack: Stack, jump: Decimal) -> None:
    stack.put({**PROJECT, "lastIssue": 2})
    stack.put(issue(1))
    stack.put(issue(2))
    stack.settle()
    rogue_update(stack, PROJECT, "SET lastIssue = :v", v=jump)
    stack.settle()
    assert all(r["batchItemFailures"] == [] for r in stack.responses)
    [alert] = stack.alerts()
    assert (alert["kind"], alert["number"], alert["through"]) == ("gap", 3, int(jump))
    assert alert["repair"]["status"] == "skipped"
    assert item(stack, issue(3)) is None


# --- 5. sequence races and resets --------------------------------------------------------


def test_an_allocation_between_the_rechecks_reads_is_never_judged(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPAIRS_ENABLED", "false")  # a repair's fence would hide the finding
    settings.cache_clear()
    allocator = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(3):
        allocator.allocate(PROJECT, strategy="gapless")
    stack.settle()
    table = runtime.reconciler().table
    parents_cls, members_cls = type(table.parents), type(table.members)
    reads = {"n": 0}
    original = parents_cls.read_parent

    def racing_read(self: Any, rule: Any, key: Any) -> Any:
        state = original(self, rule, key)
        reads["n"] += 1
        if reads["n"] == 1:  # a writer commits between the recheck's two looks
            allocator.allocate(PROJECT, strategy="gapless")
        return state

    monkeypatch.setattr(parents_cls, "read_parent", racing_read)
    original_members = members_cls.member_numbers

    def racing_members(self: Any, rule: Any, key: Any, above: int, **options: Any) -> Any:
        found = original_members(self, rule, key, above, **options)
        allocator.allocate(PROJECT, strategy="gapless")
        return found

    monkeypatch.setattr(members_cls, "member_numbers", racing_members)
    runtime.reconciler().recheck(Recheck("issue-numbers", PROJECT, 3, "race"))
    monkeypatch.undo()
    stack.settle()
    assert stack.alerts() == []


def test_allocating_threads_under_verification_raise_nothing(stack: Stack) -> None:
    allocator = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    done = threading.Event()

    def verify_continuously() -> None:
        while not done.is_set():
            stack.pump(batch_size=5)
            stack.run_rechecks()

    verifier = threading.Thread(target=verify_continuously)
    verifier.start()
    # Transactional strategies only: with this rule's grace of 0 s an atomic increment whose
    # put is still on its way is, by that configuration, already judged.
    strategies = ["gapless", "block"] * 4
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda s: [allocator.allocate(PROJECT, strategy=s) for _ in range(3)], strategies
            )
        )
    done.set()
    verifier.join()
    stack.settle()
    assert stack.alerts() == []


def test_a_reset_healed_by_a_later_allocation_is_still_alerted(stack: Stack) -> None:
    allocator = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(3):
        allocator.allocate(PROJECT, strategy="gapless")
    stack.settle()
    rogue_update(stack, PROJECT, "SET lastIssue = :v", v=0)
    rogue_update(stack, PROJECT, "SET lastIssue = :v", v=3)  # healed before any recheck
    stack.settle()
    alerts = stack.alerts()
    assert [a["kind"] for a in alerts] == ["counter_behind"]
    assert (alerts[0]["stored"], alerts[0]["actual"]) == (0, 3)


def test_the_full_audit_never_judges_a_number_handed_out_within_the_grace(stack: Stack) -> None:
    desk = {"PK": "DESK#1", "SK": "COUNTER#TICKET"}
    stack.put({**desk, "lastTicket": 1})
    stack.put({"PK": "DESK#1", "SK": "TICKET#0000000001"})
    stack.pump()
    # An atomic writer has incremented and not yet written its member.
    rogue_update(stack, desk, "ADD lastTicket :one", one=1)
    ticket = {"PK": "DESK#1", "SK": "TICKET#0000000002"}
    waits: list[float] = []

    def grace_passes(seconds: float) -> None:
        waits.append(seconds)
        stack.put(ticket)  # the writer finishes within the grace period

    checker = runtime.reconciler()
    full_audit(checker, sleep=grace_passes)
    assert waits and 0 < waits[0] <= 60
    assert item(stack, ticket) == ticket  # not voided under the writer
    assert [f.kind for f in checker.log] == []


def test_a_member_above_the_counter_hands_out_no_number_below_it(stack: Stack) -> None:
    stack.put({**PROJECT, "lastIssue": 5})
    for number in range(1, 6):
        stack.put(issue(number))
    stack.settle()
    stack.put(issue(20))  # a rogue member far above the counter
    stack.pump()
    rogue_update(stack, PROJECT, "ADD lastIssue :one", one=1)  # an atomic writer, mid-flight
    stack.run_rechecks()
    assert item(stack, issue(6)) is None  # never voided under its writer
    assert [a["kind"] for a in stack.alerts()] == ["counter_behind"]


def test_every_reset_is_alerted_not_only_the_first(stack: Stack) -> None:
    allocator = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(3):
        allocator.allocate(PROJECT, strategy="gapless")
    stack.settle()
    for _ in range(2):
        rogue_update(stack, PROJECT, "SET lastIssue = :v", v=0)
        rogue_update(stack, PROJECT, "SET lastIssue = :v", v=3)
        stack.settle()
    assert [a["kind"] for a in stack.alerts()] == ["counter_behind", "counter_behind"]


# --- 6. index members are what the rule says ---------------------------------------------


def test_an_item_of_another_rule_carrying_index_attributes_is_no_member(stack: Stack) -> None:
    stack.put({**POST, "likeTally": 1})
    stack.put({**POST, "SK": "LIKE#USER#1", "seqName": "user-numbers", "NumIdentifier": 999999})
    allocator = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    allocator.allocate(USERS, member_key={"PK": "User#Kirk", "SK": "PROFILE"})
    allocator.allocate(USERS, member_key={"PK": "User#Spock", "SK": "PROFILE"})
    stack.settle(batch_size=1)  # counter and member in separate batches: rechecks run
    assert stack.alerts() == []
    assert item(stack, USERS)["LastID"] == 2  # type: ignore[index]


# --- 7. standing drift is alerted once ---------------------------------------------------


def test_a_standing_drift_is_alerted_once_until_it_changes(stack: Stack) -> None:
    stack.put({**ORDER, "total": Decimal("0")})
    stack.put({"PK": "ORDER#17", "SK": "LINE#1", "amount": Decimal("0.30")})
    stack.settle()
    assert summary(stack.alerts()) == [("drift", None, "skipped")]
    w = likes_writer(stack)
    for n in range(2, 5):  # legitimate writes, each split across batches: unbalanced groups
        w.add_child({"PK": "ORDER#17", "SK": f"LINE#{n}"}, {"amount": Decimal("1")})
        stack.settle(batch_size=1)
    assert stack.alerts() == []
    stack.put({"PK": "ORDER#17", "SK": "LINE#9", "amount": Decimal("2")})  # the drift changes
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["stored"], alert["actual"]) == (3, "5.3")


# --- 8. deadline -------------------------------------------------------------------------


class ShortOnTime(LocalContext):
    """A context whose invocation has ``left`` milliseconds after the first group."""

    def __init__(self, left: int):
        super().__init__("tally-test")
        self.calls = 0
        self.left = left

    def get_remaining_time_in_millis(self) -> int:
        self.calls += 1
        return 60_000 if self.calls <= 1 else self.left


def test_groups_are_not_started_when_the_invocation_is_out_of_time(stack: Stack) -> None:
    for n in range(4):
        stack.put({"PK": f"POST#{n}", "SK": "META", "likeTally": 5})
    records = stack.records()
    response = reconciler_handler.handler({"Records": records}, ShortOnTime(left=1_000))
    failed = [f["itemIdentifier"] for f in response["batchItemFailures"]]
    assert len(failed) == 3
    assert set(failed) <= {r["dynamodb"]["SequenceNumber"] for r in records}
    assert len(stack.alerts()) == 1


# --- 9. privacy --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["ann@example.com", {"email": "ann@example.com"}])
def test_an_invalid_counter_alert_never_echoes_the_value(stack: Stack, value: Any) -> None:
    stack.put({**POST, "likeTally": value})
    stack.settle()
    [alert] = stack.alerts()
    assert alert["kind"] == "invalid_counter"
    assert "ann@example.com" not in str(alert)
    assert "ann@example.com" not in str(stack.audit.log.findings())
    assert "ann@example.com" not in str(stack.audit.log.repairs())
