"""A wait is never silent: what is waited for and until when, as a countdown on a terminal
and as one line otherwise (issue 21)."""

from __future__ import annotations

import io
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from tally.cli import console


def test_a_wait_off_a_terminal_is_one_line_naming_what_and_until_when(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=shown, force_terminal=False))
    slept: list[float] = []
    console.waiting("audit: the sequences' grace period", sleep=slept.append)(30)
    assert sum(slept) == pytest.approx(30)
    [line] = shown.getvalue().splitlines()
    assert line.startswith("audit: the sequences' grace period: waiting 30 s, until ")
    assert re.search(r"until \d\d:\d\d:\d\d UTC", line), line


def test_a_wait_on_a_terminal_counts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = io.StringIO()
    monkeypatch.setattr(
        console, "err", Console(file=shown, force_terminal=True, width=120, color_system=None)
    )
    clock = [1000.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(console.time, "monotonic", lambda: clock[0])
    console.waiting("audit: grace", sleep=sleep)(3)
    text = shown.getvalue()
    assert "audit: grace: waiting 3 s, until " in text
    assert "3 s left" in text and "1 s left" in text
    assert clock[0] == pytest.approx(1003)


def test_a_wait_under_a_progress_bar_counts_down_below_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = io.StringIO()
    monkeypatch.setattr(
        console, "err", Console(file=shown, force_terminal=True, width=120, color_system=None)
    )
    with console.progress("audit: items scanned", 9) as advance:
        advance(9)
        console.waiting("audit: grace", sleep=lambda _: None)(0.5)
    assert "1 s left" in shown.getvalue() and "9/9" in shown.getvalue()


def test_make_install_says_what_it_does(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    planned = subprocess.run(
        ["make", "-n", "install", f"VENV={tmp_path / 'venv'}"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "install: pip installs tally and its dev tools into" in planned


def test_local_up_says_what_it_starts_before_starting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tally.cli import app as cli
    from tally.local import stack as local_stack
    from tally.local.stack_record import LocalStackError

    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path / "state"))
    said: list[str] = []

    def up(state_dir: Path, *, starting: Callable[[], None], **kwargs: object) -> object:
        starting()  # what up() calls once all is checked, before anything starts
        said.append(capsys.readouterr().err)
        raise LocalStackError("not started in this test")

    monkeypatch.setattr(local_stack, "up", up)
    assert cli.main(["local", "up"]) == 1
    [before] = said
    assert "local stack: starting DynamoDB Local and moto's server (SNS, SQS)" in before
