"""`tally audit --engine duckdb --export DIR`: usage mistakes are named, exit 2, nothing read."""

from __future__ import annotations

from pathlib import Path

import pytest

from tally.cli import main
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
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = write_aws_export(tmp_path, [{"PK": {"S": "POST#1"}, "SK": {"S": "META"}}])
    (directory / "manifest-files.json").write_text("")
    code = main(["audit", "--engine", "duckdb", "--export", str(tmp_path)])
    assert code == 2
    assert "itemCount 1 but manifest-files.json lists 0 items" in capsys.readouterr().err
