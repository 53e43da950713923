"""Numbers across DynamoDB's whole range, exact to 38 digits, on DynamoDB Local through the
real handlers: the stream path, the carry, the recount and both full-audit engines."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.audit.full_audit import full_audit
from tally.audit.report import AuditReport
from tally.cli.rules_check import check
from tally.cli.rules_suggest import suggest
from tally.core.settings import settings as tally_settings
from tally.local.audit_duckdb import duckdb_audit
from tally.local.exports import read_export, write_export
from tally.reconciler import runtime
from tally.reconciler.repair.policy import RepairPolicy
from tally.rules import load_rules
from tally.rules.live_table import describe, sample
from tests.integration.conftest import Stack
from tests.unit.core.test_numbers import MISSING, Parent, parents, ref_storable, ref_sum

NUMBERS_RULES = Path(__file__).with_name("numbers_rules.toml")
RULES = load_rules(NUMBERS_RULES)
ACCOUNT = {"PK": "ACCOUNT#1", "SK": "META"}


@pytest.fixture
def numbers(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    monkeypatch.setenv("RULES_FILE", str(NUMBERS_RULES))
    monkeypatch.setenv("CARRY_SECONDS", "0")
    tally_settings.cache_clear()
    runtime.rules.cache_clear()
    yield stack


def raw_put(stack: Stack, item: dict[str, Any]) -> None:
    """A writer the project did not write: numbers as text, any attribute type."""
    stack.dynamodb.put_item(TableName=stack.table, Item=item)


def n(text: str) -> dict[str, str]:
    return {"N": text}


def s(text: str) -> dict[str, str]:
    return {"S": text}


def account(stack: Stack, pk: str, balance: str | None, *amounts: Any, **extra: Any) -> None:
    parent = {"PK": s(pk), "SK": s("META"), **extra}
    if balance is not None:
        parent["balance"] = n(balance)
    raw_put(stack, parent)
    for line, amount in enumerate(amounts):
        value = amount if isinstance(amount, dict) else n(amount)
        raw_put(stack, {"PK": s(pk), "SK": s(f"ENTRY#{line}"), "amount": value})


def balance(stack: Stack, pk: str) -> Any:
    response = stack.dynamodb.get_item(
        TableName=stack.table, Key={"PK": s(pk), "SK": s("META")}, ConsistentRead=True
    )
    return response["Item"].get("balance")


def audit(*, repair: bool = True, segments: int = 2) -> tuple[AuditReport, list[Any]]:
    checker = runtime.reconciler(RepairPolicy(enabled=True, dry_run=not repair, budget=10**9))
    report = full_audit(checker, segments=segments)
    return report, checker.log


def audit_export(stack: Stack, tmp_path: Path) -> tuple[AuditReport, list[Any]]:
    write_export(stack.dynamodb, stack.table, tmp_path)
    checker = runtime.reconciler(RepairPolicy(enabled=True, dry_run=False, budget=10**9))
    report = duckdb_audit(checker, read_export(tmp_path))
    return report, checker.log


def kinds(log: list[Any]) -> list[tuple[str, str, str]]:
    return sorted((f.kind, f.key["PK"], f.repair.status if f.repair else "") for f in log)


def no_failures(stack: Stack) -> bool:
    return all(r["batchItemFailures"] == [] for r in stack.responses)


def test_a_child_amount_or_counter_of_1e38_or_more_is_read_and_judged(numbers: Stack) -> None:
    stack = numbers
    account(stack, "ACCOUNT#1", "0")
    raw_put(stack, {"PK": s("POST#1"), "SK": s("META"), "likeTally": n("1E+38")})
    raw_put(stack, {"PK": s("POST#1"), "SK": s("LIKE#a")})
    stack.records()  # seeding unseen: the audit finds the counter, below
    # A transaction split by the batch boundary: the carry holds a remainder of 1E+38.
    stack.dynamodb.transact_write_items(
        TransactItems=[
            {
                "Put": {
                    "TableName": stack.table,
                    "Item": {"PK": s("ACCOUNT#1"), "SK": s("ENTRY#1"), "amount": n("1E+38")},
                }
            },
            {
                "Update": {
                    "TableName": stack.table,
                    "Key": {"PK": s("ACCOUNT#1"), "SK": s("META")},
                    "UpdateExpression": "ADD balance :a, tallyRevision :one",
                    "ExpressionAttributeValues": {":a": n("1E+38"), ":one": n("1")},
                }
            },
        ]
    )
    records = stack.records()
    assert len(records) == 2
    for record in records:
        stack.deliver([copy.deepcopy(record)])
    stack.settle()
    assert no_failures(stack)
    assert stack.alerts() == []
    assert stack.audit.carries.carry("ledger", ACCOUNT).remainder == 0
    report, log = audit()
    assert kinds(log) == [("drift", "POST#1", "applied")]  # 1E+38 likes, one child
    assert stack.item("POST#1", "META")["likeTally"] == 1  # type: ignore[index]
    assert balance(stack, "ACCOUNT#1") == n("100000000000000000000000000000000000000")
    assert report.items_scanned == 4


def test_amounts_mixing_1e20_and_1e_minus_10_balance_and_nothing_is_written(
    numbers: Stack, tmp_path: Path
) -> None:
    stack = numbers
    account(stack, "ACCOUNT#1", "100000000000000000000.0000000001", "1E+20", "1E-10")
    stack.pump()
    assert stack.alerts() == [] and no_failures(stack)
    for engine in (audit, lambda: audit_export(stack, tmp_path)):
        _, log = engine()
        assert log == []
        assert balance(stack, "ACCOUNT#1") == n("100000000000000000000.0000000001")


def test_a_rogue_change_in_the_low_digits_of_such_a_total_is_alerted(numbers: Stack) -> None:
    stack = numbers
    account(stack, "ACCOUNT#1", "100000000000000000000.0000000001", "1E+20", "1E-10")
    stack.pump()
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key={"PK": s("ACCOUNT#1"), "SK": s("META")},
        UpdateExpression="ADD balance :a",
        ExpressionAttributeValues={":a": n("1E-10")},
    )
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == (
        "drift",
        "100000000000000000000.0000000002",
        "100000000000000000000.0000000001",
    )
    assert balance(stack, "ACCOUNT#1") == n("100000000000000000000.0000000001")


def test_a_sum_needing_more_than_38_digits_is_unrepresentable_alerted_once_never_repaired(
    numbers: Stack, tmp_path: Path
) -> None:
    stack = numbers
    account(stack, "ACCOUNT#1", "1E+30", "1E+30", "1E-10")
    stack.settle()
    [alert] = stack.alerts()
    assert alert["kind"] == "unrepresentable"
    assert alert["repair"]["status"] == "skipped"
    assert alert["actual"] == "1000000000000000000000000000000.0000000001"
    assert balance(stack, "ACCOUNT#1") == n("1000000000000000000000000000000")
    for engine in (audit, lambda: audit_export(stack, tmp_path)):
        report, log = engine()
        assert (report.recounted, log) == (1, [])  # judged again, standing: not news
    assert stack.alerts() == []  # alerted once
    assert balance(stack, "ACCOUNT#1") == n("1000000000000000000000000000000")
    assert no_failures(stack)


def test_a_text_amount_on_a_child_is_a_malformed_finding_naming_key_and_attribute(
    numbers: Stack, tmp_path: Path
) -> None:
    stack = numbers
    account(stack, "ACCOUNT#1", "5", "5", s("five euros"))
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["key"], alert["attribute"]) == (
        "malformed",
        {"PK": "ACCOUNT#1", "SK": "ENTRY#1"},
        "amount",
    )
    assert "five" not in str(alert)  # the type, never the value
    assert alert["repair"]["status"] == "skipped"
    for engine in (audit, lambda: audit_export(stack, tmp_path)):
        report, log = engine()
        assert (report.recounted, log) == (1, [])  # judged again, standing: not news
    assert stack.alerts() == []
    assert balance(stack, "ACCOUNT#1") == n("5")


@pytest.mark.parametrize("revision", [None, "4"])
def test_a_null_counter_reads_as_0_and_is_repaired_over_once(
    numbers: Stack, revision: str | None
) -> None:
    """A foreign writer's NULL counter counts as an absent one (0): its drift is repaired over
    it, fenced on the counter still being absent or NULL. (Fenced on absent alone, the fence
    failed at every attempt and each recheck scheduled the next, for ever.)"""
    stack = numbers
    extra = {"tallyRevision": n(revision)} if revision else {}
    raw_put(stack, {"PK": s("ACCOUNT#9"), "SK": s("META"), "balance": {"NULL": True}, **extra})
    for entry in ("ENTRY#1", "ENTRY#2"):
        raw_put(
            stack, {"PK": s("ACCOUNT#9"), "SK": s(entry), "amount": n("-920000000000000000000")}
        )
    stack.settle()
    alerts = stack.alerts()
    assert [(a["kind"], a["repair"]["status"]) for a in alerts] == [("drift", "applied")]
    assert alerts[0]["stored"] is None and alerts[0]["actual"] == -1840000000000000000000
    parent = stack.item("ACCOUNT#9", "META")
    assert parent is not None and parent["balance"] == Decimal("-1.84E+21")


def test_a_text_revision_on_a_parent_is_a_finding_and_audit_repair_goes_on(
    numbers: Stack,
) -> None:
    stack = numbers
    account(stack, "ACCOUNT#1", "99", "5", tallyRevision=s("v1"))
    account(stack, "ACCOUNT#2", "99", "5", tallyRevision=n("3"))
    stack.records()
    report, log = audit()
    assert kinds(log) == [
        ("drift", "ACCOUNT#2", "applied"),
        ("invalid_counter", "ACCOUNT#1", "skipped"),
    ]
    [finding] = [f for f in log if f.kind == "invalid_counter"]
    assert finding.attribute == "tallyRevision"
    assert "v1" not in str(finding.body())
    assert balance(stack, "ACCOUNT#1") == n("99")
    assert balance(stack, "ACCOUNT#2") == n("5")
    assert report.recounted == 2


def test_one_item_with_a_number_of_1e38_or_more_crashes_no_command(
    numbers: Stack, tmp_path: Path
) -> None:
    stack = numbers
    account(stack, "ACCOUNT#1", "3", "1", "2")
    raw_put(stack, {"PK": s("STRAY#1"), "SK": s("X"), "big": n("-9.99E+125"), "n": n("1E+40")})
    raw_put(stack, {"PK": s("ACCOUNT#1"), "SK": s("NOTE#1"), "big": n("1E+38")})
    stack.records()
    checked = check(RULES, stack.dynamodb, stack.table, 100)
    assert checked.sampled == 5
    shape = describe(stack.dynamodb, stack.table)
    suggest(stack.dynamodb, shape, sample(stack.dynamodb, stack.table, 100), 100)
    report, log = audit()
    assert log == [] and report.items_scanned == 5
    _, log = audit_export(stack, tmp_path)
    assert log == []


# --- the same generated parents as the unit property test, on DynamoDB Local -------------

# Never repaired: a repair writes only over a number it judged, and no counter holds these.
SETTLED_ONLY = {"malformed", "unrepresentable", "invalid_counter"}


def _stays(parent: Parent, finding: tuple[str, str, str]) -> bool:
    """Findings no repair takes away: they stand after the stream path settled."""
    kind, attribute, _ = finding
    revision = parent.revision
    bad_revision = revision is not MISSING and (
        "N" not in revision or not ref_storable(ref_sum([revision["N"], "1"]))
    )
    return kind in SETTLED_ONLY or attribute == "tallyRevision" or bad_revision


@given(data=st.data())
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_generated_parents_through_the_stream_the_scan_and_the_export(
    numbers: Stack, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Each example writes one generated parent (its own partition) as a foreign writer
    would, pumps the stream through the handler and the rechecks, then audits the whole
    table with both engines: the alerts are the reference's findings, and what the repairs
    cannot take away is all either engine still finds (20 examples: each costs real I/O)."""
    stack = numbers
    parent = data.draw(parents(pk=f"ACCOUNT#{uuid.uuid4().hex[:8]}"))
    for item in [parent.parent_item(), *parent.children()]:
        raw_put(stack, item)
    stack.settle()
    assert no_failures(stack)
    expected = parent.expected()
    alerted = {(a["kind"], a["attribute"], a["key"]["SK"]) for a in stack.alerts()}
    assert alerted == expected
    standing = {f for f in expected if _stays(parent, f)}
    for engine in (lambda: _dry_audit(), lambda: _dry_export(stack, tmp_path_factory)):
        log = [f for f in engine() if f.key["PK"] == parent.pk]
        assert {(f.kind, f.attribute, f.key["SK"]) for f in log} == standing


def _dry_audit() -> list[Any]:
    checker = runtime.reconciler(
        RepairPolicy(enabled=True, dry_run=True, budget=10**9), alerting=False
    )
    full_audit(checker, segments=2)
    return checker.log


def _dry_export(stack: Stack, paths: pytest.TempPathFactory) -> list[Any]:
    directory = paths.mktemp("export")
    write_export(stack.dynamodb, stack.table, directory)
    checker = runtime.reconciler(
        RepairPolicy(enabled=True, dry_run=True, budget=10**9), alerting=False
    )
    duckdb_audit(checker, read_export(directory))
    return checker.log
