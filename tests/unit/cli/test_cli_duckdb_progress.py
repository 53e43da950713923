"""`tally audit --engine duckdb` shows its stages as the scan engine and `tally export` show
theirs: a progress bar on a terminal for DuckDB's query of the export, then one for the
candidates checked against the live table; nothing off a terminal or with --json."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from rich.console import Console

from tally.cli import console
from tally.cli.app import main
from tally.core import settings
from tally.core.dynamodb import serialize
from tally.local.template import create_table, load_template, template_path
from tally.reconciler import runtime

QUERY_STAGE = "audit: DuckDB queries the export, %"
CHECK_STAGE = "audit: candidates checked"


def _forget_cold_start() -> None:
    settings.settings.cache_clear()
    runtime.rules.cache_clear()
    runtime._clients.cache_clear()


@pytest.fixture
def exported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A target in moto (the template's tables, the alert topic, the recheck queue) holding
    one post whose counter drifted, exported by `tally export`; the export's directory."""
    for name in [n for n in os.environ if n.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(name)
    for name in ("DYNAMODB_ENDPOINT", "SNS_ENDPOINT", "SQS_ENDPOINT", "RULES_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path / "state"))
    _forget_cold_start()
    with mock_aws():
        ddb = boto3.client("dynamodb")
        template = load_template(template_path())
        create_table(ddb, template, "Table", "main")
        create_table(ddb, template, "AuditTable", "audit")
        topic = boto3.client("sns").create_topic(Name="alerts")["TopicArn"]
        queue = boto3.client("sqs").create_queue(QueueName="rechecks")["QueueUrl"]
        for name, value in (
            ("TABLE_NAME", "main"),
            ("AUDIT_TABLE_NAME", "audit"),
            ("ALERT_TOPIC_ARN", topic),
            ("RECHECK_QUEUE_URL", queue),
        ):
            monkeypatch.setenv(name, value)
        post = {"PK": "POST#1", "SK": "META", "likeTally": 5, "tallyRevision": 1}
        for item in (post, {"PK": "POST#1", "SK": "LIKE#USER#1"}):
            ddb.put_item(TableName="main", Item=serialize(item))
        assert main(["export", "--out", str(tmp_path / "exports")]) == 0
        yield tmp_path / "exports"
    _forget_cold_start()


def audit(monkeypatch: pytest.MonkeyPatch, terminal: bool, *args: str) -> str:
    """What `tally audit --engine duckdb` drew on stderr, a terminal or not."""
    shown = io.StringIO()
    drawn = Console(file=shown, force_terminal=terminal, width=160, color_system=None)
    monkeypatch.setattr(console, "err", drawn)
    assert main(["audit", "--engine", "duckdb", *args]) == 1  # the drifted counter
    return shown.getvalue()


def test_on_a_terminal_the_query_then_each_candidate_checked_is_a_progress_bar(
    exported: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = audit(monkeypatch, True, "--export", str(exported))
    assert QUERY_STAGE in err and CHECK_STAGE in err
    assert err.index(QUERY_STAGE) < err.index(CHECK_STAGE)
    queried = err[err.index(QUERY_STAGE) : err.index(CHECK_STAGE)]
    assert "100/100" in queried  # the query's bar is full before the candidates start
    assert "1/?" in err[err.index(CHECK_STAGE) :]  # one candidate: the drifted post


@pytest.mark.parametrize(("terminal", "args"), [(False, ()), (True, ("--json",))])
def test_off_a_terminal_or_with_json_no_stage_is_drawn(
    exported: Path, monkeypatch: pytest.MonkeyPatch, terminal: bool, args: tuple[str, ...]
) -> None:
    err = audit(monkeypatch, terminal, "--export", str(exported), *args)
    assert "audit: export " in err  # the export is still named
    assert QUERY_STAGE not in err and CHECK_STAGE not in err
