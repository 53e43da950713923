"""The repair switches flipped at run time (`tally repairs`): the real handlers on DynamoDB
Local read them from an SSM parameter on moto's server. Off, nothing is written and every
alert says so; on again, repairs resume; a parameter that cannot be read repairs nothing,
alerts continue, and a metric says so."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from tally.cli.app import main
from tally.core.settings import settings
from tally.handlers import recheck as recheck_handler
from tally.handlers import reconciler as reconciler_handler
from tally.local.pump import Pump
from tally.local.stream_trigger import MappingSettings
from tally.local.template import load_template, template_path
from tally.rules import load_rules
from tally.writers import TallyWriter
from tests.integration.conftest import RULES_FILE, Stack
from tests.utils import lambda_context, serialize

POST = {"PK": "POST#a91f", "SK": "META"}


@pytest.fixture
def parameter(repair_switches: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The stack's repair switches, and no local stack for `tally` to find instead."""
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path / "no-local-stack"))
    return repair_switches


@pytest.fixture
def tally(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run the `tally` command: (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exited:  # argparse's usage errors
            code = int(exited.code or 0)
        settings.cache_clear()  # the command's environment is the test's again
        out, err = capsys.readouterr()
        return code, out, err

    return run


def drift(stack: Stack, pk: str = "POST#a91f", stored: int = 9) -> None:
    stack.put({"PK": pk, "SK": "META", "likeTally": stored})
    stack.put({"PK": pk, "SK": "LIKE#USER#1"})


def test_switched_off_at_run_time_nothing_is_written_and_every_alert_says_so(
    stack: Stack, parameter: str, tally: Callable[..., tuple[int, str, str]]
) -> None:
    code, out, _ = tally("repairs", "off")
    assert code == 0 and out.strip() == f"repairs off, budget 25 (parameter {parameter})"
    drift(stack)
    stack.settle()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["repair"]["status"]) == ("drift", "disabled")
    assert parameter in alert["repair"]["reason"]
    assert alert["switches"] == {"repairs": "off", "budget": 25, "from": f"parameter {parameter}"}
    assert stack.item("POST#a91f", "META")["likeTally"] == 9  # type: ignore[index]
    assert stack.audit.log.repairs() == []


def test_switched_back_on_repairs_resume_and_dry_run_writes_nothing(
    stack: Stack, parameter: str, tally: Callable[..., tuple[int, str, str]]
) -> None:
    assert tally("repairs", "dry-run")[0] == 0
    drift(stack, "POST#dry")
    stack.settle()
    assert tally("repairs", "on")[0] == 0
    drift(stack, "POST#on")
    stack.settle()
    alerts = {a["key"]["PK"]: a for a in stack.alerts()}
    assert alerts["POST#dry"]["repair"]["status"] == "dry_run"
    assert alerts["POST#dry"]["switches"]["repairs"] == "dry_run"
    assert alerts["POST#on"]["repair"]["status"] == "applied"
    assert alerts["POST#on"]["switches"]["repairs"] == "on"
    assert stack.item("POST#dry", "META")["likeTally"] == 9  # type: ignore[index]
    assert stack.item("POST#on", "META")["likeTally"] == 1  # type: ignore[index]


def test_the_budget_flipped_at_run_time_caps_an_invocations_repairs(
    stack: Stack, parameter: str, tally: Callable[..., tuple[int, str, str]]
) -> None:
    code, out, _ = tally("repairs", "--budget", "1", "--json")
    assert code == 0 and json.loads(out)["budget"] == 1
    drift(stack, "POST#one")
    drift(stack, "POST#two")
    stack.pump()  # one invocation, one batch: both drifts in it
    statuses = sorted(a["repair"]["status"] for a in stack.alerts())
    assert statuses == ["applied", "skipped"]


def test_switches_that_cannot_be_read_fail_safe_alerts_continue_and_a_metric_says_so(
    stack: Stack,
    parameter: str,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ssm = boto3.client("ssm", endpoint_url=moto_endpoint, region_name="us-east-1")
    ssm.delete_parameter(Name=parameter)
    drift(stack)
    capsys.readouterr()
    stack.settle()
    printed = capsys.readouterr().out
    [alert] = stack.alerts()
    assert alert["repair"]["status"] == "disabled"
    assert alert["switches"]["repairs"] == "off" and alert["switches"]["unreadable"]
    assert stack.item("POST#a91f", "META")["likeTally"] == 9  # type: ignore[index]
    emitted = [
        json.loads(line)
        for line in printed.splitlines()
        if line.startswith("{") and "RepairSwitchesUnreadable" in line
    ]
    assert emitted and all(record["RepairSwitchesUnreadable"] == [1.0] for record in emitted)


def test_tally_audit_shows_the_switches_and_its_repairs_obey_them(
    stack: Stack, parameter: str, tally: Callable[..., tuple[int, str, str]]
) -> None:
    """An incident's kill switch stops an operator's `tally audit --repair` too."""
    assert tally("repairs", "off")[0] == 0
    drift(stack)
    code, out, err = tally("audit", "--repair", "--json")
    report = json.loads(out)
    assert code == 1 and report["switches"]["repairs"] == "off"
    assert (report["findings"], report["repairs"]) == ({"drift": 1}, {"disabled": 1})
    assert f"audit: repairs off, budget 25 (parameter {parameter})" in err
    assert stack.item("POST#a91f", "META")["likeTally"] == 9  # type: ignore[index]
    assert tally("repairs", "on")[0] == 0
    code, out, _ = tally("audit", "--repair", "--json")
    assert json.loads(out)["repairs"] == {"applied": 1}
    assert stack.item("POST#a91f", "META")["likeTally"] == 1  # type: ignore[index]


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["repairs", "sideways"], 2, "invalid choice"),
        (["repairs", "--budget", "-3"], 2, "a whole number from 0 to"),
        (["repairs", "--budget", "many"], 2, "a whole number from 0 to"),
    ],
)
def test_a_mistake_on_the_command_line_is_a_message_and_exit_code_2(
    parameter: str,
    tally: Callable[..., tuple[int, str, str]],
    argv: list[str],
    code: int,
    said: str,
) -> None:
    exited, _, err = tally(*argv)
    assert exited == code and said in err and "Traceback" not in err


def test_nothing_named_to_flip_is_a_message_and_exit_code_1(
    stack: Stack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tally: Callable[..., tuple[int, str, str]],
) -> None:
    monkeypatch.delenv("REPAIR_SWITCHES_PARAMETER", raising=False)
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path))
    code, _, err = tally("repairs", "off")
    assert code == 1 and "no repair switches to flip" in err and "Traceback" not in err


def test_a_value_the_functions_cannot_read_is_only_written_whole(
    stack: Stack,
    parameter: str,
    moto_endpoint: str,
    tally: Callable[..., tuple[int, str, str]],
) -> None:
    ssm = boto3.client("ssm", endpoint_url=moto_endpoint, region_name="us-east-1")
    ssm.put_parameter(Name=parameter, Type="String", Value="{}", Overwrite=True)
    code, out, _ = tally("repairs")
    assert code == 0 and out.startswith("repairs off:") and "cannot be read" in out
    code, _, err = tally("repairs", "on")
    assert code == 1 and "--budget" in err
    assert tally("repairs", "on", "--budget", "5")[0] == 0
    value = ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
    assert json.loads(value) == {"repairs_enabled": True, "dry_run": False, "repair_budget": 5}


# --- flipped during a live run ---------------------------------------------------------------

MAX_AGE = 1  # REPAIR_SWITCHES_MAX_AGE_SECONDS in the live run
WRITTEN = [f"POST#written-{n}" for n in range(4)]  # the writer threads' posts: never off


class LiveFlip:
    """Writer threads like and unlike WRITTEN's posts, the pump verifies all along (its lanes
    in threads of their own), and the test breaks fresh posts, one at a time, with the repair
    switches on, off, and on again."""

    def __init__(self, stack: Stack, rules: Any):
        from tests.harness.live import Subscriber

        self.stack = stack
        self.writer = TallyWriter(stack.dynamodb, stack.table, rules)
        self.stop = threading.Event()
        self.liked: dict[str, set[str]] = {pk: set() for pk in WRITTEN}
        self.subscriber = Subscriber(stack.sqs, stack.alert_queue)
        failures = stack.sqs.create_queue(QueueName=f"failures-{uuid.uuid4().hex[:8]}")
        self.pump = Pump(
            stack.reader,
            lambda event: reconciler_handler.handler(event, lambda_context()),
            lambda event: recheck_handler.handler(event, lambda_context()),
            stack.sqs,
            stack.recheck_queue,
            failures["QueueUrl"],
            MappingSettings.from_template(load_template(template_path())),
            rechecks_beside=True,
        )
        self.threads = [
            threading.Thread(target=self.pump.forever, name="pump"),
            *(threading.Thread(target=self.write, args=(n,), name=f"w{n}") for n in range(2)),
        ]

    def write(self, seed: int) -> None:
        """Likes and unlikes through the writer: acknowledged writes, the run's truth."""
        chance = random.Random(seed)
        while not self.stop.is_set():
            pk = chance.choice(WRITTEN)
            user = f"LIKE#USER#{seed}-{chance.randrange(6)}"
            if user in self.liked[pk]:
                self.writer.remove_child({"PK": pk, "SK": user})
                self.liked[pk].discard(user)
            else:
                self.writer.add_child({"PK": pk, "SK": user})
                self.liked[pk].add(user)

    def __enter__(self) -> LiveFlip:
        for pk in WRITTEN:
            self.stack.put({"PK": pk, "SK": "META", "likeTally": 0})
        self.subscriber.start()
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.pump.stop(1)
        for thread in self.threads:
            thread.join()
        self.pump.stop_signal = None
        assert self.pump.until_idle(max_seconds=120, rechecks=True).idle

    def fault(self, pk: str) -> dict[str, Any]:
        """A post whose counter a rogue client moves with no child behind it; its alert."""
        self.stack.put({"PK": pk, "SK": "META", "likeTally": 0})
        self.stack.dynamodb.update_item(
            TableName=self.stack.table,
            Key=serialize({"PK": pk, "SK": "META"}),
            UpdateExpression="ADD likeTally :one",
            ExpressionAttributeValues=serialize({":one": 1}),
        )
        deadline = time.monotonic() + 90  # a ceiling, not a measure
        while time.monotonic() < deadline:
            found = [a.body for a in list(self.subscriber.alerts) if a.body["key"]["PK"] == pk]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"{pk}: never alerted")


def flipped(tally: Callable[..., tuple[int, str, str]], state: str) -> None:
    """Flip the switches and wait out the functions' cache: from now on, every invocation
    starts after the parameter's change and reads it (what the faults below rely on)."""
    assert tally("repairs", state)[0] == 0
    until = time.monotonic() + MAX_AGE + 0.1
    while time.monotonic() < until:
        time.sleep(0.05)


@pytest.mark.serial
def test_flipped_during_a_live_run_repairs_stop_within_the_cache_time_and_resume(
    stack: Stack,
    parameter: str,
    monkeypatch: pytest.MonkeyPatch,
    tally: Callable[..., tuple[int, str, str]],
) -> None:
    monkeypatch.setenv("REPAIR_SWITCHES_MAX_AGE_SECONDS", str(MAX_AGE))
    settings.cache_clear()
    rules = load_rules(RULES_FILE)
    phases: dict[str, list[dict[str, Any]]] = {"on": [], "off": [], "on again": []}
    with LiveFlip(stack, rules) as run:
        for n in range(2):
            phases["on"].append(run.fault(f"POST#on-{n}"))
        flipped(tally, "off")
        for n in range(3):
            phases["off"].append(run.fault(f"POST#off-{n}"))
        flipped(tally, "on")
        for n in range(2):
            phases["on again"].append(run.fault(f"POST#again-{n}"))
    alerts = [a.body for a in run.subscriber.stop()]
    faulted = {a["key"]["PK"] for alerts_of in phases.values() for a in alerts_of}
    # Every fault alerted, once; nothing else alerted (the writers' posts never drift).
    assert sorted(a["key"]["PK"] for a in alerts) == sorted(faulted)
    for phase, status, state in (
        ("on", "applied", "on"),
        ("off", "disabled", "off"),
        ("on again", "applied", "on"),
    ):
        for alert in phases[phase]:
            assert (alert["kind"], alert["repair"]["status"]) == ("drift", status), phase
            assert alert["switches"]["repairs"] == state
            pk = alert["key"]["PK"]
            # Off: no write (the rogue +1 stands); on: the counter agrees with its 0 likes.
            stored = stack.item(pk, "META")["likeTally"]  # type: ignore[index]
            assert stored == (1 if phase == "off" else 0), pk
    repaired = {r["key"]["PK"] for r in stack.audit.log.repairs()}
    assert repaired == {a["key"]["PK"] for p in ("on", "on again") for a in phases[p]}
    for pk, likes in run.liked.items():  # no acknowledged write lost
        assert stack.item(pk, "META")["likeTally"] == len(likes), pk  # type: ignore[index]
