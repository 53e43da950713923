"""The full audit on DynamoDB Local: drift the stream never showed."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from tally.audit import scan as audit_scan
from tally.audit.full_audit import full_audit
from tally.reconciler import runtime
from tally.rules import load_rules
from tally.writers import SequenceAllocator, TallyWriter
from tests.integration.conftest import RULES_FILE, Stack

RULES = load_rules(RULES_FILE)


def seed(stack: Stack) -> None:
    """Consistent data through the writers, then drift written behind the stream's back."""
    writer = TallyWriter(stack.dynamodb, stack.table, RULES)
    for post in range(6):
        stack.put({"PK": f"POST#{post}", "SK": "META", "likeTally": 0})
        for user in range(post):
            writer.add_child({"PK": f"POST#{post}", "SK": f"LIKE#USER#{user}"})
    stack.put({"PK": "ORDER#1", "SK": "META", "total": Decimal("0")})
    writer.add_child({"PK": "ORDER#1", "SK": "LINE#1"}, {"amount": Decimal("12.34")})
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(3):
        numbers.allocate({"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"})
    stack.put({"PK": "POST#3", "SK": "META", "likeTally": 30, "tallyRevision": 3})
    stack.put({"PK": "ORDER#1", "SK": "META", "total": Decimal("1.00"), "tallyRevision": 1})
    stack.put({"PK": "POST#orphaned", "SK": "LIKE#USER#1"})
    stack.delete("PROJECT#A", "ISSUE#0000000002")
    stack.records()  # the stream's records are lost: only the audit can see this now


def test_the_full_audit_finds_what_the_stream_never_showed_and_repairs_it(stack: Stack) -> None:
    seed(stack)
    report = full_audit(runtime.reconciler(), segments=3)
    assert report.parents == {"likes": 7, "order-total": 1, "issue-numbers": 1}
    assert report.findings == {"drift": 2, "orphans": 1, "gap": 1}
    assert report.repairs == {"applied": 2, "skipped": 2}
    assert report.recounted == 3  # only parents whose scanned numbers disagree
    alerts = {(a["kind"], a["rule"]): a for a in stack.alerts()}
    assert alerts["drift", "likes"]["key"] == {"PK": "POST#3", "SK": "META"}
    assert alerts["drift", "likes"]["actual"] == 3
    assert alerts["drift", "order-total"]["actual"] == "12.34"
    assert alerts["orphans", "likes"]["key"] == {"PK": "POST#orphaned", "SK": "META"}
    assert alerts["gap", "issue-numbers"]["number"] == 2
    assert stack.item("POST#3", "META")["likeTally"] == 3  # type: ignore[index]


def test_a_second_audit_after_repairs_comes_back_clean_and_alerts_nothing_new(
    stack: Stack,
) -> None:
    seed(stack)
    full_audit(runtime.reconciler())
    stack.alerts()
    again = full_audit(runtime.reconciler())
    assert again.repairs.get("applied", 0) == 0
    assert set(again.findings) <= {"drift", "orphans"}  # the alert-mode sum and the orphans
    assert stack.alerts() == []  # already alerted: de-duplicated


def test_auditing_one_parent_checks_only_that_parent(stack: Stack) -> None:
    seed(stack)
    report = full_audit(runtime.reconciler(), parent={"PK": "POST#3", "SK": "META"}, rule="likes")
    assert report.items_scanned == 0
    assert report.findings == {"drift": 1}
    assert stack.item("POST#3", "META")["likeTally"] == 3  # type: ignore[index]


def test_an_error_while_checking_stops_the_scanning_threads_and_is_raised(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    for post in range(40):
        stack.put({"PK": f"POST#{post}", "SK": "META", "likeTally": 1})  # 40 candidates
    # A queue of one: the scanning threads are blocked handing over when the check fails.
    monkeypatch.setattr(audit_scan, "_QUEUE_SIZE", 1)
    checker = runtime.reconciler()

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the table went away")

    monkeypatch.setattr(checker, "audit_parent", fail)
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="the table went away"):
        full_audit(checker, segments=4)
    assert threading.active_count() == before


@pytest.mark.parametrize("alerting", [False, True])
def test_the_audit_report_shows_drift_already_alerted_as_standing(
    stack: Stack, alerting: bool
) -> None:
    """What is wrong now: a drift the stream alerted is in the report, marked standing."""
    writer = TallyWriter(stack.dynamodb, stack.table, RULES)
    stack.put({"PK": "ORDER#1", "SK": "META", "total": Decimal("0")})
    writer.add_child({"PK": "ORDER#1", "SK": "LINE#1"}, {"amount": Decimal("12.34")})
    stack.settle()
    stack.dynamodb.update_item(  # a rogue total on an alert-only rule: alerted, not repaired
        TableName=stack.table,
        Key={"PK": {"S": "ORDER#1"}, "SK": {"S": "META"}},
        UpdateExpression="SET #t = :t",
        ExpressionAttributeNames={"#t": "total"},
        ExpressionAttributeValues={":t": {"N": "99"}},
    )
    stack.settle()
    [alerted] = stack.alerts()
    checker = runtime.reconciler(alerting=alerting)
    report = full_audit(checker, rule="order-total")
    [off] = report.state
    assert (off.finding.kind, off.finding.key, off.status) == ("drift", alerted["key"], "standing")
    assert off.alerted_at is not None and off.alerted_at[:10] == alerted["detected_at"][:10]
    assert report.as_json()["state"][0]["status"] == "standing"
    assert stack.alerts() == []  # SNS stays de-duplicated
