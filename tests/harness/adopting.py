"""An existing table adopted on the local stack (docs/adopting.md), and the commands a user
runs against it: the examples in ``examples/adopting/``, shared by the adopting and seed tests.
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from tally.cli import app as cli
from tally.local import inbox, runner, stack_record
from tally.local.dynamodb_local import local_client_kwargs
from tally.rules import RuleSet, parse_rules
from tests.utils import deserialize

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "adopting"


@dataclass
class Adopted:
    """One adopted table on the local stack, and the commands a user runs against it."""

    stack: stack_record.LocalStack
    state_dir: Path
    rules: RuleSet
    capsys: pytest.CaptureFixture[str]
    seen_alerts: int = 0

    @property
    def table(self) -> str:
        return self.stack.table_name

    @property
    def dynamodb(self) -> Any:
        return self.stack.client("dynamodb")

    def tally(self, *args: str) -> tuple[int, str]:
        """`tally ARGS` in process: exit code and standard output."""
        self.capsys.readouterr()
        code = cli.main(list(args))
        return code, self.capsys.readouterr().out

    def settle(self) -> None:
        """`tally pump --until-idle`, until no recheck is waiting out its grace period."""
        pump = runner.pump(self.stack, self.state_dir)
        deadline = time.monotonic() + 180
        while True:
            before = pump.report.records + pump.report.rechecks
            report = pump.until_idle(30)
            moved = report.records + report.rechecks != before
            if not moved and not report.pending_rechecks:
                break
            assert time.monotonic() < deadline, "the stream and the rechecks never went quiet"
            if not moved:
                time.sleep(0.5)

    def alerts(self) -> list[dict[str, Any]]:
        sqs = self.stack.client("sqs")
        return inbox.collect(sqs, self.stack.alert_inbox_url, self.state_dir)

    def new_alerts(self) -> list[dict[str, Any]]:
        """The alerts received since the last call (``alerts`` returns every one so far)."""
        every = self.alerts()
        new, self.seen_alerts = every[self.seen_alerts :], len(every)
        return new

    def check(self) -> dict[str, Any]:
        code, out = self.tally("rules", "check", "--json")
        report: dict[str, Any] = json.loads(out)
        assert code == (1 if report["flags"] else 0)
        return report

    def suggested(self) -> RuleSet:
        code, out = self.tally("rules", "suggest", "--sample", "200")
        assert code == 0, out
        return parse_rules(tomllib.loads(out))

    def table_resource(self) -> Any:
        """The table as a boto3 resource, as seed 002's writer uses it."""
        return boto3.resource(
            "dynamodb", **local_client_kwargs(self.stack.dynamodb_endpoint)
        ).Table(self.table)

    def items(self) -> list[dict[str, Any]]:
        return [deserialize(raw) for raw in self.dynamodb.scan(TableName=self.table)["Items"]]
