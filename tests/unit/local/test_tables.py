"""One table for every command: audit, alerts, rules check and the demo draw it alike."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tally.cli import app as cli
from tally.local.tables import ALERT_COLUMNS, ALERT_WIDTHS, alert_row, table


def alert(pk: str, kind: str = "drift") -> dict[str, object]:
    return {
        "kind": kind,
        "rule": "likes",
        "key": {"PK": pk, "SK": "META"},
        "stored": 100,
        "actual": 3,
        "severity": "warning",
        "repair": {"status": "applied"},
    }


def drawn(*tables: object, width: int = 200) -> list[str]:
    shown = Console(file=io.StringIO(), width=width, highlight=False)
    for each in tables:
        shown.print(each)
    return [line for line in shown.file.getvalue().splitlines() if line.strip()]  # type: ignore[attr-defined]


def column_starts(line: str, cells: list[str]) -> list[int]:
    starts, at = [], 0
    for cell in cells:
        at = line.index(cell, at)
        starts.append(at)
        at += len(cell)
    return starts


def test_a_long_key_does_not_push_the_columns_after_it() -> None:
    short, long = alert("POST#a91f"), alert("POST#" + "x" * 60, kind="ttl_removal")
    lines = drawn(table(ALERT_COLUMNS, [alert_row(short), alert_row(long)]))
    header, rows = lines[0], [line for line in lines[2:]]
    assert header.split() == list(ALERT_COLUMNS)
    starts = [column_starts(row, ["100", "3", "warning", "applied"]) for row in rows]
    assert starts[0] == starts[1], rows


def test_followed_alerts_printed_apart_line_up_and_a_long_key_folds() -> None:
    first = table(ALERT_COLUMNS, [alert_row(alert("POST#a91f"))], widths=ALERT_WIDTHS)
    later = table(
        ALERT_COLUMNS,
        [alert_row(alert("POST#" + "y" * 80))],
        widths=ALERT_WIDTHS,
        header=False,
    )
    lines = drawn(first, later)
    rows = [line for line in lines if "warning" in line]
    assert len(rows) == 2
    starts = [column_starts(row, ["likes", "100", "3", "warning", "applied"]) for row in rows]
    assert starts[0] == starts[1], rows
    assert sum("y" in line for line in lines) >= 2  # folded inside its column, not cut


def test_cells_are_text_never_markup() -> None:
    [row] = drawn(table(["key"], [["[bold]PK=A[/bold]"]], header=False))
    assert "[bold]PK=A[/bold]" in row


@pytest.mark.parametrize(
    "command",
    [
        ["alerts"],
        ["audit"],
        ["export"],
        ["pump"],
        ["rules", "check"],
        ["rules", "suggest"],
    ],
)
def test_every_command_that_reports_has_json(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    assert "  --json" in capsys.readouterr().out, command
