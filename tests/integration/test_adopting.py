"""docs/adopting.md, run: three existing table shapes adopted with `tally local up --rules ...
--template ...`, written by their teams' own writers (the seeds' code), checked with `tally rules
check`, proposed by `tally rules suggest`, and each caught in a fault by the pump.

The local stacks use the session's DynamoDB Local (DYNAMODB_ENDPOINT) and start their own moto
server; the Social walk spawns `tally local up`, the rest calls the same entry point in process.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tally import cli
from tally.local import inbox, runner
from tally.local import stack as local_stack
from tally.rules import RuleSet, load_rules, parse_rules

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "adopting"


@dataclass
class Adopted:
    """One adopted table on the local stack, and the commands a user runs against it."""

    stack: local_stack.LocalStack
    state_dir: Path
    rules: RuleSet
    capsys: pytest.CaptureFixture[str]

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

    def check(self) -> dict[str, Any]:
        code, out = self.tally("rules", "check", "--json")
        report: dict[str, Any] = json.loads(out)
        assert code == (1 if report["flags"] else 0)
        return report

    def suggested(self) -> RuleSet:
        code, out = self.tally("rules", "suggest", "--sample", "200")
        assert code == 0, out
        return parse_rules(tomllib.loads(out))


@pytest.fixture
def adopt(
    tmp_path: Path,
    dynamodb_endpoint: str,
    dynamodb: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[Callable[..., Adopted]]:
    state_dir = tmp_path / "state"
    monkeypatch.setenv("DYNAMODB_ENDPOINT", dynamodb_endpoint)
    monkeypatch.setenv("TALLY_STATE_DIR", str(state_dir))
    monkeypatch.delenv("RULES_FILE", raising=False)
    monkeypatch.setattr(cli, "STATE_DIR", state_dir)

    def start(shape: str, table_id: str, *, spawn: bool = False) -> Adopted:
        rules = EXAMPLES / shape / "rules.toml"
        args = ["local", "up", "--rules", str(rules)]
        args += ["--template", str(EXAMPLES / shape / "template.yaml"), "--table-id", table_id]
        if spawn:
            subprocess.run(
                [sys.executable, "-m", "tally.cli", *args],
                env=os.environ,
                check=True,
                capture_output=True,
                timeout=120,
            )
        else:
            assert cli.main(args) == 0
        stack = local_stack.load(state_dir)
        assert stack is not None and stack.rules_file == str(rules)
        return Adopted(stack, state_dir, load_rules(rules), capsys)

    try:
        yield start
    finally:
        local_stack.down(state_dir)
        for table in (local_stack.TABLE, local_stack.AUDIT_TABLE):
            with contextlib.suppress(dynamodb.exceptions.ResourceNotFoundException):
                dynamodb.delete_table(TableName=table)


def same_rule(proposed: RuleSet, example: RuleSet, keys: list[dict[str, str]]) -> None:
    """The proposal is the example's rule: same kind and counter, same roles on every key."""
    [mine], [theirs] = list(proposed), list(example)
    assert (mine.kind, mine.counter) == (theirs.kind, theirs.counter)
    assert proposed.table == example.table
    for key in keys:
        roles = [(m.role, m.parent_key) for m in proposed.classify(key)]
        assert roles == [(m.role, m.parent_key) for m in example.classify(key)], key


def scanned_keys(adopted: Adopted) -> list[dict[str, str]]:
    items = adopted.dynamodb.scan(TableName=adopted.table)["Items"]
    return [
        {k: v.get("S") or v["N"] for k, v in item.items() if k in adopted.rules.table.names}
        for item in items
    ]


# --- seed 004: the Social table (PK/SK) -------------------------------------------------------


def create_post(dynamodb: Any, table: str, post: str) -> None:
    item = {"PK": {"S": post}, "SK": {"S": "META"}, "likeTally": {"N": "0"}, "body": {"S": "hi"}}
    dynamodb.put_item(TableName=table, Item=item)


def like(dynamodb: Any, table: str, post: str, user: str) -> None:
    """Seed 004's writer: the like and the count in one transaction, the like only once."""
    dynamodb.transact_write_items(
        TransactItems=[
            {
                "Put": {
                    "TableName": table,
                    "Item": {
                        "PK": {"S": post},
                        "SK": {"S": f"LIKE#USER#{user}"},
                        "likedAt": {"N": "1750636800"},
                    },
                    "ConditionExpression": "attribute_not_exists(SK)",
                }
            },
            {
                "Update": {
                    "TableName": table,
                    "Key": {"PK": {"S": post}, "SK": {"S": "META"}},
                    "UpdateExpression": "ADD likeTally :one",
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                }
            },
        ]
    )


def test_social_likes_adopted_checked_suggested_and_a_drift_caught(
    adopt: Callable[..., Adopted],
) -> None:
    social = adopt("social", "SocialTable", spawn=True)
    rng = random.Random(4)
    likes = 0
    for p in range(40):
        post = f"POST#{p:04x}"
        create_post(social.dynamodb, social.table, post)
        for user in rng.sample(range(100), rng.randrange(0, 10)):
            like(social.dynamodb, social.table, post, f"{user:04x}")
            likes += 1
    social.settle()
    assert social.alerts() == []

    report = social.check()  # with the rules the stack was started with
    assert report["rules"]["likes"] == {"parents": 40, "children_or_members": likes}
    assert report["flags"] == []

    same_rule(social.suggested(), social.rules, scanned_keys(social))

    # A batch import puts a like behind the writer's back: the count is one short.
    social.dynamodb.put_item(
        TableName=social.table,
        Item={"PK": {"S": "POST#0003"}, "SK": {"S": "LIKE#USER#import"}},
    )
    social.settle()
    [alert] = social.alerts()
    assert (alert["kind"], alert["rule"], alert["key"]) == (
        "drift",
        "likes",
        {"PK": "POST#0003", "SK": "META"},
    )
    assert alert["actual"] == alert["stored"] + 1
    assert alert["repair"]["status"] == "skipped"  # repair = "alert": nothing written

    # The audit reads the stack's rules (the example's would call this table clean). The
    # drift already alerted stands and is not reported again; a second import is new.
    social.dynamodb.put_item(
        TableName=social.table,
        Item={"PK": {"S": "POST#0004"}, "SK": {"S": "LIKE#USER#import"}},
    )
    code, out = social.tally("audit", "--json")
    report = json.loads(out)
    assert code == 0 and report["findings"] == {"drift": 1}
    assert [f["key"] for f in report["findings_detail"]] == [{"PK": "POST#0004", "SK": "META"}]


# --- seed 001: orders keyed by a partition key alone ------------------------------------------


def place_order(dynamodb: Any, table: str, *, crash: bool = False) -> int:
    """Seed 001's writer: ADD to the counter, then put the order under the new number."""
    response = dynamodb.update_item(
        TableName=table,
        Key={"pk": {"S": "orderCounter"}},
        UpdateExpression="ADD #cnt :val",
        ExpressionAttributeNames={"#cnt": "count"},
        ExpressionAttributeValues={":val": {"N": "1"}},
        ReturnValues="UPDATED_NEW",
    )
    number = response["Attributes"]["count"]["N"]
    if not crash:
        item = {"pk": {"S": number}, "deliveryMethod": {"S": "expedited"}}
        dynamodb.put_item(TableName=table, Item=item)
    return int(number)


def test_orders_adopted_checked_suggested_and_a_gap_caught(
    adopt: Callable[..., Adopted],
) -> None:
    orders = adopt("orders", "OrdersTable")
    for _ in range(120):
        place_order(orders.dynamodb, orders.table)
    orders.dynamodb.put_item(
        TableName=orders.table, Item={"pk": {"S": "customer#7"}, "name": {"S": "Ada"}}
    )
    orders.settle()
    assert orders.alerts() == []

    report = orders.check()
    assert report["rules"]["order-ids"] == {"parents": 1, "children_or_members": 120}
    assert report["unrelated"] == 1 and report["flags"] == []

    same_rule(orders.suggested(), orders.rules, scanned_keys(orders))

    # The writer crashes between its two steps: number 121 is handed out, never used.
    lost = place_order(orders.dynamodb, orders.table, crash=True)
    place_order(orders.dynamodb, orders.table)
    orders.settle()
    [alert] = orders.alerts()
    assert (alert["kind"], alert["rule"], alert["number"]) == ("gap", "order-ids", lost)
    assert alert["key"] == {"pk": "orderCounter"}


# --- seed 002: projects whose issues are numbered by a number sort key ------------------------


def create_project(dynamodb: Any, table: str, project: str) -> None:
    item = {"pk": {"S": project}, "sk": {"N": "0"}, "lastIssue": {"N": "0"}}
    dynamodb.put_item(TableName=table, Item=item)


def open_issue(dynamodb: Any, table: str, project: str) -> int:
    """Seed 002's writer: the highest issue number plus one, put only if absent; the project's
    lastIssue follows in the same transaction."""
    found = dynamodb.query(
        TableName=table,
        KeyConditionExpression="pk = :p AND sk > :zero",
        ExpressionAttributeValues={":p": {"S": project}, ":zero": {"N": "0"}},
        ScanIndexForward=False,
        Limit=1,
        ConsistentRead=True,
    )["Items"]
    number = int(found[0]["sk"]["N"]) + 1 if found else 1
    dynamodb.transact_write_items(
        TransactItems=[
            {
                "Put": {
                    "TableName": table,
                    "Item": {
                        "pk": {"S": project},
                        "sk": {"N": str(number)},
                        "priority": {"S": "low"},
                    },
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
            {
                "Update": {
                    "TableName": table,
                    "Key": {"pk": {"S": project}, "sk": {"N": "0"}},
                    "UpdateExpression": "SET lastIssue = :n",
                    "ExpressionAttributeValues": {":n": {"N": str(number)}},
                }
            },
        ]
    )
    return number


def test_projects_adopted_checked_suggested_and_a_counter_behind_caught(
    adopt: Callable[..., Adopted],
) -> None:
    projects = adopt("projects", "ProjectsTable")
    rng = random.Random(2)
    issues = 0
    for p in range(20):
        project = f"project{p:02d}"
        create_project(projects.dynamodb, projects.table, project)
        for _ in range(rng.randrange(1, 12)):
            open_issue(projects.dynamodb, projects.table, project)
            issues += 1
    projects.settle()
    assert projects.alerts() == []

    report = projects.check()
    assert report["rules"]["issue-numbers"] == {"parents": 20, "children_or_members": issues}
    assert report["flags"] == []

    same_rule(projects.suggested(), projects.rules, scanned_keys(projects))

    # A back-office import adds the next issue itself and leaves lastIssue behind.
    last = int(
        projects.dynamodb.get_item(
            TableName=projects.table, Key={"pk": {"S": "project07"}, "sk": {"N": "0"}}
        )["Item"]["lastIssue"]["N"]
    )
    projects.dynamodb.put_item(
        TableName=projects.table,
        Item={"pk": {"S": "project07"}, "sk": {"N": str(last + 1)}, "priority": {"S": "high"}},
    )
    projects.settle()
    [alert] = projects.alerts()
    assert (alert["kind"], alert["key"]) == ("counter_behind", {"pk": "project07", "sk": "0"})
    assert (alert["stored"], alert["actual"]) == (last, last + 1)
