"""Every sample event under events/ goes through the handler template.yaml names for it.

Each file ``events/<FunctionLogicalId>/<scenario>.json`` is invoked in process with that
function's environment from the template (the bundled ``rules.toml``, resolved against the
code directory as Lambda would), against DynamoDB Local seeded for the scenario, and the
outcome is asserted: the response, the alerts, the recheck queue and the table.

A new event file is collected automatically and fails until SCENARIOS says what it should do.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import moto.sqs.models
import pytest
import sqlglot
from boto3.dynamodb.types import TypeSerializer
from moto.core.utils import unix_time_millis

from tally.handlers import writer_api
from tally.local.functions import environ, environment, function, functions
from tally.local.template import template_path
from tally.rules import CountRule, SequenceRule, SumRule, load_rules
from tests.integration.conftest import Stack
from tests.utils import lambda_context

EVENTS_DIR = template_path().parent / "events"
EVENT_FILES = sorted(EVENTS_DIR.glob("*/*.json"))
EVENT_DIRS = sorted(path for path in EVENTS_DIR.iterdir() if path.is_dir())
RECHECK_SAMPLE = EVENTS_DIR / "RecheckFunction" / "recheck_message.json"

ATHENA_DATABASE = "tally_audit_local"
POST = {"PK": "POST#a91f", "SK": "META"}
ORDER = {"PK": "ORDER#17", "SK": "META"}
COUNTER = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


# --- the table before each scenario ---------------------------------------------------------


def post(likes: Any, revision: int) -> dict[str, Any]:
    return {
        **POST,
        "title": "Release notes for 1.4",
        "authorId": "USER#3f11",
        "likeTally": likes,
        "tallyRevision": revision,
    }


def likes(*users: str) -> list[dict[str, Any]]:
    return [
        {"PK": POST["PK"], "SK": f"LIKE#USER#{user}", "likedAt": "2025-01-15T09:49:58Z"}
        for user in users
    ]


def issue_counter(last: int) -> dict[str, Any]:
    return {**COUNTER, "lastIssue": last}


def issues(*numbers: int) -> list[dict[str, Any]]:
    return [{"PK": COUNTER["PK"], "SK": f"ISSUE#{n:010d}", "title": f"Issue {n}"} for n in numbers]


def order(total: str, *amounts: str) -> list[dict[str, Any]]:
    lines = [
        {"PK": ORDER["PK"], "SK": f"LINE#{i}", "amount": Decimal(amount)}
        for i, amount in enumerate(amounts, start=1)
    ]
    return [{**ORDER, "total": Decimal(total), "tallyRevision": len(amounts)}, *lines]


# --- running a scenario ---------------------------------------------------------------------


@dataclass
class Run:
    """One scenario's stack, and the calls Lambda would make with the template's wiring."""

    stack: Stack
    template: dict[str, Any]
    monkeypatch: pytest.MonkeyPatch
    switches: str  # the repair switches' parameter (conftest's repair_switches)
    invoked_at: float = 0.0

    @property
    def names(self) -> dict[str, str]:
        """The template's logical ids the environment refers to, as this stack names them."""
        return {
            "Table": self.stack.table,
            "AuditTable": self.stack.audit_table,
            "AlertTopic": self.stack.topic_arn,
            "RecheckQueue": self.stack.recheck_queue,
            "AuditDatabase": ATHENA_DATABASE,
            "RepairSwitches": self.switches,
        }

    def invoke(self, logical_id: str, event: dict[str, Any]) -> Any:
        """The template's handler for ``logical_id``, called with the template's environment."""
        self.invoked_at = unix_time_millis()  # no message this call sends is older
        values = environment(self.template, logical_id, self.names)
        # The bundled rules file, found through the code directory as in Lambda.
        assert (Path(values["LAMBDA_TASK_ROOT"]) / values["RULES_FILE"]).is_file()
        handler = function(self.template, logical_id).load()
        # environ() resets settings and the reconciler's caches, not the writer API's.
        writer_api._writers.cache_clear()
        try:
            with environ(values):
                return handler(event, lambda_context(logical_id))
        finally:
            writer_api._writers.cache_clear()

    def rule(self, name: str) -> CountRule | SumRule | SequenceRule:
        """The bundled rule ``name``, as the functions load it."""
        values = environment(self.template, "ReconcilerFunction", self.names)
        return load_rules(Path(values["LAMBDA_TASK_ROOT"]) / values["RULES_FILE"])[name]

    def grace_seconds(self, rule: str) -> int:
        found = self.rule(rule)
        assert isinstance(found, SequenceRule)
        return found.grace_seconds

    def queued_rechecks(self) -> int:
        """Messages on the recheck queue, visible or still delayed."""
        attributes = self.stack.sqs.get_queue_attributes(
            QueueUrl=self.stack.recheck_queue,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"],
        )["Attributes"]
        return sum(int(value) for value in attributes.values())

    def rechecks_due(self, after_seconds: int, since_invoked: bool = False) -> list[dict[str, Any]]:
        """Recheck messages receivable once ``after_seconds`` have passed (moto's clock moves).

        ``since_invoked`` counts from when the last invocation began, not from now, so that a
        slow machine cannot make a message look older than it is.
        """
        # moto's SQS runs in this process; its delay check reads this clock.
        start = self.invoked_at if since_invoked else unix_time_millis()
        moment = start + after_seconds * 1000
        self.monkeypatch.setattr(moto.sqs.models, "unix_time_millis", lambda: moment)
        messages: list[dict[str, Any]] = self.stack.sqs.receive_message(
            QueueUrl=self.stack.recheck_queue, MaxNumberOfMessages=10, WaitTimeSeconds=0
        ).get("Messages", [])
        return messages

    def deliver_rechecks(self, messages: list[dict[str, Any]]) -> None:
        """Invoke the recheck function with the messages, as the SQS event source does."""
        envelope = json.loads(RECHECK_SAMPLE.read_text())["Records"][0]
        queue_name = self.stack.recheck_queue.rsplit("/", 1)[-1]
        records = [
            {
                **envelope,
                "messageId": message["MessageId"],
                "receiptHandle": message["ReceiptHandle"],
                "body": message["Body"],
                "md5OfBody": message["MD5OfBody"],
                "eventSourceARN": f"arn:aws:sqs:us-east-1:123456789012:{queue_name}",
            }
            for message in messages
        ]
        response = self.invoke("RecheckFunction", {"Records": records})
        assert response == {"batchItemFailures": []}

    def recheck_after_grace(self, rule: str) -> dict[str, Any]:
        """The one recheck the scenario scheduled: held for the grace period, then delivered."""
        grace = self.grace_seconds(rule)
        assert self.queued_rechecks() == 1
        if grace:
            assert self.rechecks_due(after_seconds=grace - 1, since_invoked=True) == []
        messages = self.rechecks_due(after_seconds=grace + 1)
        assert len(messages) == 1
        body: dict[str, Any] = json.loads(messages[0]["Body"])
        self.deliver_rechecks(messages)
        return body


Check = Callable[[Run, Any], None]


@dataclass(frozen=True)
class Scenario:
    seed: list[dict[str, Any]]
    check: Check


def one_alert(run: Run) -> dict[str, Any]:
    alerts = run.stack.alerts()
    assert len(alerts) == 1, alerts
    return alerts[0]


def item(run: Run, key: dict[str, str]) -> dict[str, Any] | None:
    return run.stack.item(key["PK"], key["SK"])


def counter_value(run: Run, key: dict[str, str], attribute: str) -> Any:
    parent = item(run, key)
    assert parent is not None
    return parent[attribute]


def like_tally(run: Run) -> Any:
    return counter_value(run, POST, "likeTally")


# --- what each scenario must do -------------------------------------------------------------


def balanced(likes_now: int) -> Check:
    """The batch's counter moves equal its child moves: nothing to report, nothing written."""

    def check(run: Run, response: Any) -> None:
        assert response == {"batchItemFailures": []}
        assert run.stack.alerts() == []
        assert run.queued_rechecks() == 0
        assert like_tally(run) == likes_now

    return check


def repaired(kind: str, stored: Any, actual: int, severity: str) -> Check:
    """One alert of ``kind`` on the post; the likes rule repairs automatically."""

    def check(run: Run, response: Any) -> None:
        assert response == {"batchItemFailures": []}
        alert = one_alert(run)
        assert (alert["kind"], alert["rule"], alert["key"]) == (kind, "likes", POST)
        assert (alert["stored"], alert["actual"]) == (stored, actual)
        assert alert["severity"] == severity
        assert alert["repair"]["status"] == "applied"
        assert like_tally(run) == actual
        assert run.queued_rechecks() == 0

    return check


def check_rogue_overwrite(run: Run, response: Any) -> None:
    repaired("drift", 100, 3, "warning")(run, response)
    # The repair bumps the revision, so writers fenced on the old one retry.
    parent = item(run, POST)
    assert parent is not None and parent["tallyRevision"] > 6


def check_malformed(run: Run, response: Any) -> None:
    # Neither the string counter nor the record without keys may block the shard, and a
    # counter holding text is alerted, never overwritten: a repair writes only over a number.
    assert response == {"batchItemFailures": []}
    alert = one_alert(run)
    assert (alert["kind"], alert["rule"], alert["key"]) == ("invalid_counter", "likes", POST)
    assert (alert["stored"], alert["actual"], alert["severity"]) == (
        "string of 2 characters",
        3,
        "critical",
    )
    assert alert["repair"]["status"] == "skipped"
    assert like_tally(run) == "12"
    assert run.queued_rechecks() == 0


def check_gap_found(run: Run) -> None:
    """Number 3 of PROJECT#A is missing: a gap alert, and a VOID only if the rule repairs."""
    alert = one_alert(run)
    assert (alert["kind"], alert["rule"], alert["key"]) == ("gap", "issue-numbers", COUNTER)
    assert alert["number"] == 3
    tombstone = item(run, {"PK": COUNTER["PK"], "SK": "ISSUE#0000000003"})
    if run.rule("issue-numbers").repair == "auto":
        assert alert["repair"]["status"] == "applied"
        assert tombstone is not None and tombstone["void"] is True
        # 1..4 are now all accounted for; the next recheck starts after them.
        assert run.stack.audit.watermarks.watermark("issue-numbers", COUNTER) == 4
    else:
        assert alert["repair"]["status"] == "skipped"
        assert tombstone is None
        # Numbers up to the first gap are settled; the next recheck starts after them.
        assert run.stack.audit.watermarks.watermark("issue-numbers", COUNTER) == 2
    # A gap never moves the counter.
    assert item(run, COUNTER) == issue_counter(4)


def check_sequence_gap(run: Run, response: Any) -> None:
    assert response == {"batchItemFailures": []}
    # Not a gap yet: number 3's put may still be on its way. Nothing is alerted now.
    assert run.stack.alerts() == []
    body = run.recheck_after_grace("issue-numbers")
    assert (body["rule"], body["key"], body["counter_seen"]) == ("issue-numbers", COUNTER, 4)
    check_gap_found(run)


def check_counter_reset(run: Run, response: Any) -> None:
    assert response == {"batchItemFailures": []}
    # A sequence never goes backwards: the decrease is alerted at once.
    [seen] = run.stack.alerts()
    assert (seen["kind"], seen["stored"], seen["actual"]) == ("counter_behind", 0, 7)
    assert seen["repair"]["status"] == "skipped"
    body = run.recheck_after_grace("issue-numbers")
    assert (body["rule"], body["key"]) == ("issue-numbers", COUNTER)
    alert = one_alert(run)
    assert (alert["kind"], alert["key"]) == ("counter_behind", COUNTER)
    assert (alert["stored"], alert["actual"], alert["severity"]) == (0, 7, "critical")
    if run.rule("issue-numbers").repair == "auto":
        # Raised to the highest member, so the next number handed out cannot collide.
        assert alert["repair"]["status"] == "applied"
        assert counter_value(run, COUNTER, "lastIssue") == 7
    else:
        assert alert["repair"]["status"] == "skipped"
        assert counter_value(run, COUNTER, "lastIssue") == 0


def check_recheck_message(run: Run, response: Any) -> None:
    assert response == {"batchItemFailures": []}
    check_gap_found(run)


def api(status: int, outcome: str) -> Callable[[Any], dict[str, Any]]:
    def parse(response: Any) -> dict[str, Any]:
        assert response["statusCode"] == status, response
        body: dict[str, Any] = json.loads(response["body"])
        assert body["outcome"] == outcome
        return body

    return parse


def check_add_child(run: Run, response: Any) -> None:
    assert api(201, "created")(response)["replayed"] is False
    child = item(run, {"PK": POST["PK"], "SK": "LIKE#USER#7c20"})
    assert child is not None and child["likedAt"] == "2025-01-15T09:49:58Z"
    assert item(run, POST) == post(3, 6)
    # The same request again (same Idempotency-Key) is answered, not applied twice.
    event = json.loads((EVENTS_DIR / "WriterFunction" / "api_add_child.json").read_text())
    assert api(201, "created")(run.invoke("WriterFunction", event))["replayed"] is True
    assert like_tally(run) == 3


def check_remove_child(run: Run, response: Any) -> None:
    api(200, "removed")(response)
    assert item(run, {"PK": POST["PK"], "SK": "LIKE#USER#7c20"}) is None
    assert item(run, POST) == post(2, 7)


def check_change_amount(run: Run, response: Any) -> None:
    api(200, "changed")(response)
    line = item(run, {"PK": ORDER["PK"], "SK": "LINE#3"})
    assert line is not None and line["amount"] == Decimal("12.50")
    parent = item(run, ORDER)
    assert parent is not None
    assert (parent["total"], parent["tallyRevision"]) == (Decimal("42.50"), 4)


def check_allocate(run: Run, response: Any) -> None:
    body = api(201, "created")(response)
    member = {"PK": COUNTER["PK"], "SK": "ISSUE#0000000003"}
    assert (body["numbers"], body["member_keys"]) == ([3], [member])
    assert item(run, COUNTER) == issue_counter(3)
    created = item(run, member)
    assert created is not None and created["title"] == "Checkout button misaligned on mobile"


AUDIT_SEED = [post(5, 6), *likes("7c20", "19ab", "e5b2"), *order("30.00", "20.00", "10.00")]
AUDIT_SEED += [issue_counter(2), *issues(1, 2)]


def check_scheduled_beat(run: Run, response: Any) -> None:
    # The template's defaults are a single-Region stack (no GlobalRegions), where the
    # function is not even deployed: invoked anyway, it beats to no one and writes nothing.
    assert response == {"skipped": "not a Global Table: no Region to beat to"}
    for region in ("us-east-1", "eu-west-1", os.environ.get("AWS_REGION", "us-east-1")):
        assert run.stack.item(f"tally#heartbeat#{region}", "tally#heartbeat") is None


def check_scheduled_audit(run: Run, response: Any) -> None:
    assert set(response) == {
        "rules",
        "engine",
        "items_scanned",
        "read_capacity",
        "export",
        "parents_checked",
        "candidates",
        "recounted",
        "sequences_checked",
        "unindexed_seen",
        "findings",
        "repairs",
        "seconds",
        "state",
    }
    assert response["rules"] == ["likes", "order-total", "issue-numbers", "user-numbers"]
    assert [(s["kind"], s["status"]) for s in response["state"]] == [("drift", "new")]
    assert (response["engine"], response["items_scanned"]) == ("scan", len(AUDIT_SEED))
    assert response["parents_checked"] == {"likes": 1, "order-total": 1, "issue-numbers": 1}
    # Only the post whose scanned numbers disagree is recounted; the order agrees.
    assert (response["recounted"], response["sequences_checked"]) == (1, 1)
    assert (response["findings"], response["repairs"]) == ({"drift": 1}, {"applied": 1})
    alert = one_alert(run)
    assert (alert["kind"], alert["key"], alert["stored"], alert["actual"]) == (
        "drift",
        POST,
        5,
        3,
    )
    assert like_tally(run) == 3
    # Sequences wait out their grace period on the recheck queue.
    body = run.recheck_after_grace("issue-numbers")
    assert (body["key"], body["counter_seen"], body["reason"]) == (COUNTER, 2, "full audit")
    assert run.stack.alerts() == []


def check_audit_query(run: Run, response: Any) -> None:
    export = "01736985600000-a1b2c3d4"
    table = f"export_{export.replace('-', '_')}"
    location = f"s3://tally-reconciler-auditbucket-1a2b3c4d5e6f/exports/AWSDynamoDB/{export}/data/"
    assert response["export_id"] == export and response["location"] == location
    create = response["create"]
    assert create.startswith(f"CREATE EXTERNAL TABLE IF NOT EXISTS `{ATHENA_DATABASE}`.`{table}`")
    assert create.endswith(f"LOCATION '{location}'")
    assert f'FROM "{ATHENA_DATABASE}"."{table}"' in response["query"]
    sqlglot.parse_one(response["query"], read="athena")
    assert response["drop"] == f"DROP TABLE IF EXISTS `{ATHENA_DATABASE}`.`{table}`"


def check_audit_candidates(run: Run, response: Any) -> None:
    assert (response["engine"], response["candidates"]) == ("athena", 2)
    assert (response["recounted"], response["sequences_checked"]) == (1, 1)
    assert (response["findings"], response["repairs"]) == ({"drift": 1}, {"applied": 1})
    alert = one_alert(run)
    assert (alert["kind"], alert["key"], alert["stored"], alert["actual"]) == ("drift", POST, 5, 3)
    # The sequence waits out its grace period on the recheck queue, judged up to the
    # counter the export saw.
    body = run.recheck_after_grace("issue-numbers")
    assert (body["key"], body["counter_seen"], body["reason"]) == (COUNTER, 4, "full audit")
    check_gap_found(run)


SCENARIOS: dict[str, Scenario] = {
    "ReconcilerFunction/like_added": Scenario(
        [post(3, 6), *likes("7c20", "19ab", "e5b2")], balanced(3)
    ),
    "ReconcilerFunction/unlike": Scenario([post(2, 7), *likes("19ab", "e5b2")], balanced(2)),
    "ReconcilerFunction/rogue_counter_overwrite": Scenario(
        [post(100, 6), *likes("7c20", "19ab", "e5b2")], check_rogue_overwrite
    ),
    "ReconcilerFunction/child_without_counter": Scenario(
        [post(3, 6), *likes("7c20", "19ab", "e5b2", "9d41")],
        repaired("drift", 3, 4, "warning"),
    ),
    "ReconcilerFunction/ttl_expiry": Scenario(
        [post(3, 6), *likes("7c20", "19ab")], repaired("ttl_removal", 3, 2, "info")
    ),
    "ReconcilerFunction/sequence_gap": Scenario(
        [issue_counter(4), *issues(1, 2, 4)], check_sequence_gap
    ),
    "ReconcilerFunction/counter_reset": Scenario(
        [issue_counter(0), *issues(1, 2, 3, 4, 5, 6, 7)], check_counter_reset
    ),
    "ReconcilerFunction/malformed_record": Scenario(
        [post("12", 6), *likes("7c20", "19ab", "e5b2")], check_malformed
    ),
    "WriterFunction/api_add_child": Scenario([post(2, 5), *likes("19ab", "e5b2")], check_add_child),
    "WriterFunction/api_remove_child": Scenario(
        [post(3, 6), *likes("7c20", "19ab", "e5b2")], check_remove_child
    ),
    "WriterFunction/api_change_amount": Scenario(
        order("37.50", "20.00", "10.00", "7.50"), check_change_amount
    ),
    "WriterFunction/api_allocate": Scenario([issue_counter(2), *issues(1, 2)], check_allocate),
    "RecheckFunction/recheck_message": Scenario(
        [issue_counter(4), *issues(1, 2, 4)], check_recheck_message
    ),
    "AuditFunction/scheduled_audit": Scenario(AUDIT_SEED, check_scheduled_audit),
    "HeartbeatFunction/scheduled_beat": Scenario([post(0, 0)], check_scheduled_beat),
    "AuditQueryFunction/export_completed": Scenario([], check_audit_query),
    "AuditCandidatesFunction/candidate_batch": Scenario(
        [post(5, 6), *likes("7c20", "19ab", "e5b2"), issue_counter(4), *issues(1, 2, 4)],
        check_audit_candidates,
    ),
}


# --- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EVENT_FILES, ids=_name)
def test_event(
    path: Path,
    stack: Stack,
    repair_switches: str,
    template: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scenario = SCENARIOS.get(_name(path))
    assert scenario is not None, f"{path}: add a scenario for it to SCENARIOS"
    for item in scenario.seed:
        stack.put(item)
    run = Run(stack, template, monkeypatch, repair_switches)
    response = run.invoke(path.parent.name, json.loads(path.read_text()))
    scenario.check(run, response)


@pytest.mark.parametrize("directory", EVENT_DIRS, ids=lambda path: path.name)
def test_event_directory_names_a_function(directory: Path, template: dict[str, Any]) -> None:
    names = {spec.logical_id for spec in functions(template)}
    assert directory.name in names, f"{directory} is not a function in template.yaml: {names}"


def test_every_function_has_events(template: dict[str, Any]) -> None:
    covered = {path.parent.name for path in EVENT_FILES}
    assert {spec.logical_id for spec in functions(template)} <= covered


def test_every_scenario_has_its_event_file() -> None:
    assert set(SCENARIOS) == {_name(path) for path in EVENT_FILES}


def test_events_dir_holds_only_function_directories() -> None:
    loose = {path.name for path in EVENTS_DIR.iterdir() if path.is_file()}
    assert loose == set()


# --- `tally invoke` on the local stack says what the handler did -------------------------------


@pytest.fixture(scope="module")
def local_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A user's shell with `tally local up` run and `tally local env` exported."""
    prefixes = ("AWS_ENDPOINT_URL", "DYNAMODB", "TABLE_NAME", "AUDIT_TABLE", "POWERTOOLS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.pop("RULES_FILE", None)
    env["TALLY_STATE_DIR"] = str(tmp_path_factory.mktemp("invoke") / "state")
    tally = [sys.executable, "-m", "tally.cli"]
    subprocess.run([*tally, "local", "up"], env=env, check=True, capture_output=True)
    try:
        exports = subprocess.run(
            [*tally, "local", "env"], env=env, check=True, capture_output=True, text=True
        ).stdout
        for line in exports.splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            [env[name]] = shlex.split(value)
        yield env
    finally:
        subprocess.run([*tally, "local", "down"], env=env, capture_output=True)


def _emptied(dynamodb: Any, table: str) -> None:
    keys = [
        k["AttributeName"] for k in dynamodb.describe_table(TableName=table)["Table"]["KeySchema"]
    ]
    for page in dynamodb.get_paginator("scan").paginate(TableName=table):
        for found in page["Items"]:
            dynamodb.delete_item(TableName=table, Key={k: found[k] for k in keys})


# What `tally invoke` prints for a sample event, on the scenario's table (SCENARIOS' seed).
INVOKE_SUMMARIES: dict[str, tuple[list[str], list[str]]] = {
    "ReconcilerFunction/like_added": (
        [
            "invoke: records: 2 seen, none skipped\n",
            "invoke: groups: 1 balanced (no read), 0 carried to a later batch, "
            "1 parent checked (0 recounts)\n",
            "invoke: nothing alerted: the counters checked agree with the table as it is now",
        ],
        ["finding:", "invoke: alerted:", "recheck"],
    ),
    "ReconcilerFunction/rogue_counter_overwrite": (
        [
            "invoke: records: 1 seen, none skipped\n",
            "1 parent checked (1 recount)\n",
            "invoke: finding: drift of likes at PK=POST#a91f,SK=META, repair applied\n",
            "invoke: alerted: drift",
            "stored 100 actual 3",
        ],
        ["nothing alerted"],
    ),
    "ReconcilerFunction/malformed_record": (
        [
            "invoke: records: 2 seen, skipped: 1 malformed (no readable keys or images)\n",
            "invoke: finding: invalid_counter of likes at PK=POST#a91f,SK=META, repair skipped\n",
            "invoke: alerted: invalid_counter",
        ],
        ["nothing alerted"],
    ),
    "ReconcilerFunction/sequence_gap": (
        [
            "invoke: recheck scheduled: unbalanced of issue-numbers PROJECT#A/COUNTER#ISSUE, due ",
            "UTC (in 30 s): `tally pump --until-settled` delivers it\n",
            "invoke: nothing alerted yet: the recheck decides\n",
        ],
        ["finding:", "invoke: alerted:"],
    ),
}


def tally_invoke(
    function: str, event: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`tally invoke FUNCTION EVENT` in the checkout, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "tally.cli", "invoke", function, event],
        env=env,
        cwd=EVENTS_DIR.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize("name", sorted(INVOKE_SUMMARIES))
def test_tally_invoke_says_what_the_handler_did(name: str, local_session: dict[str, str]) -> None:
    session = local_session
    with environ({k: v for k, v in session.items() if k.startswith(("AWS_",))}):
        dynamodb = boto3.client("dynamodb")
        for table in (session["TABLE_NAME"], session["AUDIT_TABLE_NAME"]):
            _emptied(dynamodb, table)
        serializer = TypeSerializer()
        for item in SCENARIOS[name].seed:
            dynamodb.put_item(
                TableName=session["TABLE_NAME"],
                Item={k: serializer.serialize(v) for k, v in item.items()},
            )
    invoked = tally_invoke(name.split("/", 1)[0], f"events/{name}.json", session)
    assert invoked.returncode == 0, invoked.stderr
    assert "Traceback" not in invoked.stderr
    shown, absent = INVOKE_SUMMARIES[name]
    for text in shown:
        assert text in invoked.stderr, invoked.stderr
    for text in absent:
        assert text not in invoked.stderr, invoked.stderr


def test_a_writer_api_event_given_to_the_reconciler_is_refused(
    local_session: dict[str, str],
) -> None:
    invoked = tally_invoke(
        "ReconcilerFunction", "events/WriterFunction/api_add_child.json", local_session
    )
    assert invoked.returncode == 2, invoked.stderr
    assert "is an HTTP API event, not a DynamoDB stream event" in invoked.stderr
    assert "nothing alerted" not in invoked.stderr and "Traceback" not in invoked.stderr
