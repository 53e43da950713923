"""The export engine on DynamoDB Local: `tally export`'s files, DuckDB's query, the recount."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tally.audit.full_audit import full_audit
from tally.cli import app as cli
from tally.local.audit_duckdb import duckdb_audit
from tally.local.exports import TableIdentity, read_export, write_export
from tally.local.template import create_table
from tally.reconciler import runtime
from tally.reconciler.findings import Finding
from tally.reconciler.repair.policy import RepairPolicy
from tally.rules import load_rules
from tally.writers import SequenceAllocator, TallyWriter
from tests.integration.conftest import RULES_FILE, Stack
from tests.utils import serialize

RULES = load_rules(RULES_FILE)

# What seed() breaks behind the stream's back: (kind, rule, partition key, number).
PLANTED = {
    ("drift", "likes", "POST#3", None),
    ("orphans", "likes", "POST#orphaned", None),
    ("drift", "order-total", "ORDER#1", None),
    ("drift", "members", "TEAM#1", None),
    ("gap", "issue-numbers", "PROJECT#A", 2),
    ("counter_behind", "issue-numbers", "PROJECT#B", None),
    ("duplicate", "issue-numbers", "PROJECT#C", 3),
    ("gap", "user-numbers", "UserMetadata", 2),
}


def seed(stack: Stack) -> None:
    """Consistent data through the writers, then the planted problems, unseen by the stream."""
    writer = TallyWriter(stack.dynamodb, stack.table, RULES)
    for post in range(6):
        stack.put({"PK": f"POST#{post}", "SK": "META", "likeTally": 0})
        for user in range(post):
            writer.add_child({"PK": f"POST#{post}", "SK": f"LIKE#USER#{user}"})
    stack.put({"PK": "ORDER#1", "SK": "META", "total": Decimal("0")})
    writer.add_child({"PK": "ORDER#1", "SK": "LINE#1"}, {"amount": Decimal("12.34")})
    stack.put({"PK": "ORDER#2", "SK": "META", "total": Decimal("0")})
    for line, amount in enumerate(("0.10", "0.20"), start=1):
        writer.add_child({"PK": "ORDER#2", "SK": f"LINE#{line}"}, {"amount": Decimal(amount)})
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for project in "ABC":
        for _ in range(3):
            numbers.allocate({"PK": f"PROJECT#{project}", "SK": "COUNTER#ISSUE"})
    stack.put({"PK": "UserMetadata", "SK": "META", "LastID": 3})
    for name, number in (("ann", 1), ("cy", 3)):
        stack.put(
            {"PK": f"User#{name}", "SK": "A", "seqName": "user-numbers", "NumIdentifier": number}
        )
    stack.put({"PK": "TEAM#1", "SK": "META", "memberCount": 5})
    for member in range(2):
        stack.put({"PK": "TEAM#1", "SK": f"MEMBER#{member}"})
    # Behind the stream's back:
    stack.put({"PK": "POST#3", "SK": "META", "likeTally": 30, "tallyRevision": 3})
    stack.put({"PK": "ORDER#1", "SK": "META", "total": Decimal("1.00"), "tallyRevision": 1})
    stack.put({"PK": "POST#orphaned", "SK": "LIKE#USER#1"})
    stack.delete("PROJECT#A", "ISSUE#0000000002")
    stack.put({"PK": "PROJECT#B", "SK": "COUNTER#ISSUE", "lastIssue": 1})
    stack.put({"PK": "PROJECT#C", "SK": "ISSUE#000000003"})  # number 3, a second time
    stack.records()  # the stream's records are lost: only the audit can see this now


def found(log: list[Finding]) -> set[tuple[str, str, str, int | None]]:
    return {(f.kind, f.rule, f.key["PK"], f.number) for f in log}


def test_the_export_engine_finds_exactly_the_planted_findings(stack: Stack, tmp_path: Path) -> None:
    seed(stack)
    export = write_export(stack.dynamodb, stack.table, tmp_path, segments=3, items_per_file=7)
    checker = runtime.reconciler()
    report = duckdb_audit(checker, read_export(tmp_path))

    assert found(checker.log) == PLANTED
    assert report.candidates == 8  # one per planted parent or counter, nothing else
    assert (report.engine, report.items_scanned, report.read_capacity) == ("duckdb", 0, 0)
    assert report.export == {
        "id": export.export_id,
        "table_arn": export.table_arn,
        "export_time": export.export_time,
        "items": export.item_count,
    }
    alerts = {(a["kind"], a["key"]["PK"]): a for a in stack.alerts()}
    assert alerts["drift", "ORDER#1"]["actual"] == "12.34"
    assert alerts["drift", "POST#3"]["repair"]["status"] == "applied"
    assert stack.item("POST#3", "META")["likeTally"] == 3  # type: ignore[index]
    # The gaps got their VOID tombstones, the counter behind was raised.
    assert stack.item("PROJECT#A", "ISSUE#0000000002")["void"] is True  # type: ignore[index]
    assert stack.item("PROJECT#B", "COUNTER#ISSUE")["lastIssue"] == 3  # type: ignore[index]


def test_the_scan_engine_and_the_export_engine_agree(stack: Stack, tmp_path: Path) -> None:
    seed(stack)
    write_export(stack.dynamodb, stack.table, tmp_path)
    logs = []
    for engine in ("scan", "duckdb"):
        # A dry run each, so the first engine's repairs leave the second its findings.
        checker = runtime.reconciler(RepairPolicy(enabled=True, dry_run=True, budget=100))
        if engine == "scan":
            full_audit(checker, segments=2)
        else:
            duckdb_audit(checker, read_export(tmp_path))
        logs.append(found(checker.log))
        forget_audit_state(stack)
    assert logs[0] == logs[1] == PLANTED


def forget_audit_state(stack: Stack) -> None:
    """Start the next engine afresh: the recheck looks above a sequence's watermark only, and
    a finding already alerted (its standing slot) is not reported again."""
    for item in stack.dynamodb.scan(TableName=stack.audit_table, ConsistentRead=True)["Items"]:
        if item["SK"]["S"] == "WATERMARK" or item["SK"]["S"].startswith("STANDING#"):
            key = {"PK": item["PK"], "SK": item["SK"]}
            stack.dynamodb.delete_item(TableName=stack.audit_table, Key=key)


def test_a_candidate_repaired_between_export_and_recheck_is_not_reported(
    stack: Stack, tmp_path: Path
) -> None:
    stack.put({"PK": "POST#1", "SK": "META", "likeTally": 5, "tallyRevision": 1})
    for user in range(2):
        stack.put({"PK": "POST#1", "SK": f"LIKE#USER#{user}"})
    stack.records()
    write_export(stack.dynamodb, stack.table, tmp_path)
    # After the export, before the audit: someone sets the counter right.
    stack.put({"PK": "POST#1", "SK": "META", "likeTally": 2, "tallyRevision": 2})

    checker = runtime.reconciler()
    report = duckdb_audit(checker, read_export(tmp_path))

    assert (report.candidates, report.recounted) == (1, 1)  # the export still shows the drift
    assert report.findings == {} and checker.log == []  # the recount does not
    assert stack.alerts() == []


def test_tally_export_writes_every_item_in_the_export_layout(stack: Stack, tmp_path: Path) -> None:
    items = [
        {"PK": f"POST#{i}", "SK": "META", "likeTally": i, "blob": b"\x00\xff"} for i in range(9)
    ]
    items.append({"PK": "ORDER#1", "SK": "LINE#1", "amount": Decimal("0.000001"), "tags": {"a"}})
    for item in items:
        stack.put(item)

    export = write_export(stack.dynamodb, stack.table, tmp_path, segments=2, items_per_file=4)

    directory = tmp_path / "AWSDynamoDB" / export.export_id
    assert export.directory == directory
    assert {p.name for p in directory.iterdir()} == {
        "_started",
        "data",
        "manifest-summary.json",
        "manifest-summary.checksum",
        "manifest-files.json",
        "manifest-files.checksum",
    }
    summary = json.loads((directory / "manifest-summary.json").read_text())
    assert summary["itemCount"] == len(items) == export.item_count
    assert summary["outputFormat"] == "DYNAMODB_JSON" and summary["exportType"] == "FULL_EXPORT"
    assert summary["exportArn"] == f"{summary['tableArn']}/export/{export.export_id}"
    assert all(f.item_count <= 4 for f in export.files)
    lines: list[dict[str, Any]] = []
    for data in export.files:
        with gzip.open(data.path, "rt") as handle:
            lines += [json.loads(line) for line in handle]
    assert all(set(line) == {"Item"} for line in lines)
    # DynamoDB JSON as the export writes it: binary base64, numbers as text.
    expected = [_export_json(serialize(item)) for item in items]
    key = lambda item: (item["PK"]["S"], item["SK"]["S"])  # noqa: E731
    assert sorted((line["Item"] for line in lines), key=key) == sorted(expected, key=key)


def _export_json(item: dict[str, Any]) -> dict[str, Any]:
    import base64

    out: dict[str, Any] = {}
    for name, value in item.items():
        ((kind, inner),) = value.items()
        if kind == "B":
            inner = base64.b64encode(inner).decode()
        out[name] = {kind: inner}
    return out


def test_the_duckdb_audit_takes_the_target_tables_export_and_names_it(
    stack: Stack,
    template: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two exports under one directory, the newer of another table with a parent ours lacks:
    the audit takes the target's own and names it; the other is refused unless asked for."""
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path / "state"))
    exports = tmp_path / "exports"
    stack.put({"PK": "POST#1", "SK": "META", "likeTally": 5, "tallyRevision": 1})
    stack.put({"PK": "POST#1", "SK": "LIKE#USER#1"})
    ours = write_export(stack.dynamodb, stack.table, exports)
    other = f"{stack.table}-other"
    create_table(stack.dynamodb, template, "Table", other)
    try:
        counter = {"PK": "PROJECT#Z", "SK": "COUNTER#ISSUE", "lastIssue": 5}
        stack.dynamodb.put_item(TableName=other, Item=serialize(counter))
        theirs = write_export(stack.dynamodb, other, exports)
    finally:
        stack.dynamodb.delete_table(TableName=other)
    described = stack.dynamodb.describe_table(TableName=stack.table)["Table"]
    assert ours.table_arn == described["TableArn"] != theirs.table_arn
    assert theirs.export_time >= ours.export_time

    def audit(*args: str) -> tuple[int, str, str]:
        code = cli.main(["audit", "--engine", "duckdb", *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, out, err = audit("--export", str(exports), "--json")
    report = json.loads(out)
    assert code == 1 and report["findings"] == {"drift": 1}
    assert report["export"] | {"items": 0} == {
        "id": ours.export_id,
        "table_arn": described["TableArn"],
        "export_time": ours.export_time,
        "items": 0,
    }
    assert (
        f"audit: export {ours.export_id} of table {described['TableArn']}, exported "
        f"{ours.export_time}, 2 items, in {ours.directory}"
    ) in err
    assert f"audit: 1 exports of other tables under {exports} left out" in err

    # The other table's export alone: refused, naming both tables, before anything is read.
    code, out, err = audit("--export", str(theirs.directory), "--repair")
    assert (code, out) == (2, "")
    assert err.strip() == (
        f"tally: --export {theirs.directory}: export {theirs.export_id} (exported "
        f"{theirs.export_time}) is of table {theirs.table_arn}, not of the target's table "
        f"{described['TableArn']}; --export-of-another-table audits it anyway"
    )
    # Knowingly, as a dry run: named as another table's, and nothing is written.
    code, out, err = audit("--export", str(theirs.directory), "--export-of-another-table")
    assert code in (0, 1)
    assert f"audit: export {theirs.export_id} of table {theirs.table_arn}" in err
    assert "that export is of another table than the target's" in err
    assert stack.item("PROJECT#Z", "COUNTER#ISSUE") is None
    assert stack.item("POST#1", "META")["likeTally"] == 5  # type: ignore[index]
    assert (
        stack.dynamodb.query(
            TableName=stack.table,
            KeyConditionExpression="PK = :pk",
            ExpressionAttributeValues={":pk": {"S": "PROJECT#Z"}},
        )["Items"]
        == []
    )


def test_an_export_of_an_earlier_table_of_the_same_name_is_refused(
    stack: Stack,
    template: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another stack's table of the same name (here: the table dropped and created again)."""
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path / "state"))
    stack.put({"PK": "POST#1", "SK": "META", "likeTally": 0})
    before = write_export(stack.dynamodb, stack.table, tmp_path)
    stack.dynamodb.delete_table(TableName=stack.table)
    create_table(stack.dynamodb, template, "Table", stack.table)
    now = TableIdentity.described(stack.dynamodb.describe_table(TableName=stack.table)["Table"])
    then = TableIdentity.exported(before.summary)
    assert then.arn == now.arn and not then.same(now)
    code = cli.main(["audit", "--engine", "duckdb", "--export", str(tmp_path), "--repair"])
    err = capsys.readouterr().err
    assert code == 2
    assert (
        f"is of table {then.named_against(now)}, not of the target's table "
        f"{now.named_against(then)}; --export-of-another-table audits it anyway"
    ) in err
    assert stack.item("POST#1", "META") is None  # nothing written into the new table


def test_a_stale_export_never_drives_a_write_under_a_parent_deleted_since(
    stack: Stack, tmp_path: Path
) -> None:
    """The export shows a gap and a drift; the application then deleted both parents with
    their children. Every candidate is judged against the live table: nothing is written."""
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for _ in range(3):
        numbers.allocate({"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"})
    stack.delete("PROJECT#A", "ISSUE#0000000002")
    stack.put({"PK": "POST#3", "SK": "META", "likeTally": 30})
    stack.put({"PK": "POST#3", "SK": "LIKE#USER#1"})
    stack.records()
    write_export(stack.dynamodb, stack.table, tmp_path)
    for pk, sk in (
        ("PROJECT#A", "COUNTER#ISSUE"),
        ("PROJECT#A", "ISSUE#0000000001"),
        ("PROJECT#A", "ISSUE#0000000003"),
        ("POST#3", "META"),
        ("POST#3", "LIKE#USER#1"),
    ):
        stack.delete(pk, sk)
    checker = runtime.reconciler()
    report = duckdb_audit(checker, read_export(tmp_path))
    assert report.candidates == 2  # the export still shows both
    assert checker.log == [] and report.state == []
    assert stack.alerts() == []
    scan = stack.dynamodb.scan(TableName=stack.table, ConsistentRead=True)
    assert scan["Items"] == []
