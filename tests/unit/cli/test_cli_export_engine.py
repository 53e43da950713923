"""`tally audit --engine duckdb --export DIR`: usage mistakes are named, exit 2, nothing read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tally.cli import operate, targets
from tally.cli.app import main
from tally.local.exports import ForeignExportError, TableIdentity, export_of
from tests.utils import write_aws_export


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "duckdb"], "--export goes with --engine duckdb"),
        (["--export", "{tmp}"], "--export goes with --engine duckdb"),
        (["--engine", "duckdb", "--export", "{tmp}/x", "--parent", "PK=a,SK=b"], "--parent"),
        (["--engine", "duckdb", "--export", "{tmp}/nowhere"], "nowhere: no such file"),
        (["--engine", "duckdb", "--export", "{tmp}"], "no DynamoDB export under it"),
    ],
)
def test_usage_mistakes_are_named_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["audit", *(a.format(tmp=tmp_path) for a in args)])
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    assert message in captured.err


def test_a_damaged_export_is_refused_before_anything_is_audited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target(monkeypatch)
    directory = write_aws_export(tmp_path, [{"PK": {"S": "POST#1"}, "SK": {"S": "META"}}])
    (directory / "manifest-files.json").write_text("")
    code = main(["audit", "--engine", "duckdb", "--export", str(tmp_path)])
    assert code == 2
    assert "itemCount 1 but manifest-files.json lists 0 items" in capsys.readouterr().err


# --- which export: the target table's own, named; another table's only knowingly -----------

TALLY = "arn:aws:dynamodb:us-east-1:123456789012:table/tally"
TALLY_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"  # write_aws_export's
OTHER = "arn:aws:dynamodb:eu-west-1:999999999999:table/tally"
TARGET = TableIdentity(TALLY, TALLY_ID)
ITEM = {"PK": {"S": "POST#1"}, "SK": {"S": "META"}, "likeTally": {"N": "0"}}


def rewrite_summary(directory: Path, **changes: Any) -> None:
    path = directory / "manifest-summary.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def exports(root: Path) -> tuple[Path, Path]:
    """Ours (the target's table), and a newer one of another table under the same root."""
    ours = write_aws_export(root / "a", [ITEM], export_id="01736985600000-0000aaaa")
    theirs = write_aws_export(root / "b", [ITEM, ITEM], export_id="01737072000000-0000bbbb")
    rewrite_summary(theirs, tableArn=OTHER, exportTime="2025-01-17T00:00:00.000Z")
    return ours, theirs


def test_the_newest_export_of_the_target_table_is_chosen_and_the_others_left_out(
    tmp_path: Path,
) -> None:
    ours, theirs = exports(tmp_path)
    chosen = export_of(tmp_path, TARGET)
    assert (chosen.directory, chosen.table_arn, chosen.left_out) == (ours, TALLY, 1)
    # Without the table id (an export written before it was recorded), the ARN decides.
    rewrite_summary(ours, tableId=None)
    assert export_of(tmp_path, TARGET).directory == ours
    # Knowingly: another table's export, when the path holds none of the target's.
    assert export_of(tmp_path, TARGET, any_table=True).directory == ours
    assert export_of(theirs, TARGET, any_table=True).directory == theirs


def test_an_export_of_another_table_is_refused_naming_both_tables(tmp_path: Path) -> None:
    _, theirs = exports(tmp_path)
    with pytest.raises(ForeignExportError) as refused:
        export_of(theirs, TARGET)
    assert str(refused.value) == (
        f"{theirs}: export 01737072000000-0000bbbb (exported 2025-01-17T00:00:00.000Z) is of "
        f"table {OTHER}, not of the target's table {TALLY}"
    )
    with pytest.raises(ForeignExportError) as refused:
        export_of(tmp_path / "b", TARGET)
    assert "not of the target's table" in str(refused.value)


def test_an_export_of_an_earlier_table_of_the_same_name_is_refused(tmp_path: Path) -> None:
    ours, _ = exports(tmp_path)
    rewrite_summary(ours, tableId="11111111-2222-3333-4444-555555555555")
    with pytest.raises(ForeignExportError) as refused:
        export_of(tmp_path / "a", TARGET)
    assert (
        f"is of table {TALLY} (table id 11111111-2222-3333-4444-555555555555), not of the "
        f"target's table {TALLY} (table id {TALLY_ID})" in str(refused.value)
    )
    # No table id (DynamoDB Local): `tally export` records when the table was created.
    rewrite_summary(ours, tableId=None, tableCreationDateTime="2025-01-01T00:00:00.000Z")
    created = TableIdentity(TALLY, None, "2025-02-02T00:00:00.000Z")
    with pytest.raises(ForeignExportError) as refused:
        export_of(tmp_path / "a", created)
    assert (
        f"is of table {TALLY} (created 2025-01-01T00:00:00.000Z), not of the target's table "
        f"{TALLY} (created 2025-02-02T00:00:00.000Z)" in str(refused.value)
    )
    assert export_of(tmp_path / "a", TableIdentity(TALLY)).directory == ours


def target(monkeypatch: pytest.MonkeyPatch, arn: str = TALLY) -> None:
    """A target table that needs no AWS: its ARN and id as DescribeTable would give them."""
    monkeypatch.setenv("TABLE_NAME", "tally")
    monkeypatch.setenv("TALLY_STATE_DIR", "/nonexistent/state")
    monkeypatch.setattr(targets, "item_count", lambda: 1)
    monkeypatch.setattr(operate, "_target_table", lambda: {"TableArn": arn, "TableId": TALLY_ID})


def test_the_audit_refuses_another_tables_export_and_says_how_to_take_it_anyway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, theirs = exports(tmp_path)
    target(monkeypatch)
    code = main(["audit", "--engine", "duckdb", "--export", str(theirs), "--repair"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == (
        f"tally: --export {theirs}: export 01737072000000-0000bbbb (exported "
        f"2025-01-17T00:00:00.000Z) is of table {OTHER}, not of the target's table {TALLY}; "
        "--export-of-another-table audits it anyway"
    )


def test_export_of_another_table_goes_with_an_export(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--export-of-another-table"]) == 2
    assert "--export-of-another-table goes with --engine duckdb --export" in (
        capsys.readouterr().err
    )
