"""`tally local up/down/env`: background processes that outlive the command, template.yaml's
resources in them, and exports that point plain boto3 at them."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest

from tally.local import inbox, stack_record, state
from tally.local import stack as local_stack
from tally.local.functions import bundled_rules
from tally.local.stack import down, up
from tally.local.stack_record import (
    LocalStack,
    LocalStackError,
    exports,
    load,
    sam_env,
)
from tally.local.state import SAM_ENV_FILE, STATE_FILE

EXPORTED = {
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_DYNAMODB_STREAMS",
    "AWS_ENDPOINT_URL_SNS",
    "AWS_ENDPOINT_URL_SQS",
    "AWS_ENDPOINT_URL_SSM",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "TABLE_NAME",
    "AUDIT_TABLE_NAME",
    "ALERT_TOPIC_ARN",
    "RECHECK_QUEUE_URL",
    "STREAM_FAILURE_QUEUE_URL",
    "ALERT_INBOX_URL",
    "REPAIR_SWITCHES_PARAMETER",
    "RULES_FILE",
    "SAM_CLI_TELEMETRY",
}


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A stack started by a process that has exited by the time the tests use it."""
    state_dir = tmp_path_factory.mktemp("local")
    environment = {k: v for k, v in os.environ.items() if k != "DYNAMODB_ENDPOINT"}
    script = "import sys, pathlib, tally.local.stack as s; s.up(pathlib.Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", script, str(state_dir)], env=environment, check=True)
    stack = load(state_dir)
    assert stack is not None
    yield stack
    down(state_dir)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_up_creates_the_templates_tables_topic_and_queues(
    local: LocalStack, template: dict[str, Any]
) -> None:
    dynamodb = local.client("dynamodb")
    for logical_id, name in (("Table", local.table_name), ("AuditTable", local.audit_table_name)):
        table = dynamodb.describe_table(TableName=name)["Table"]
        assert table["KeySchema"] == template["Resources"][logical_id]["Properties"]["KeySchema"]
    table = dynamodb.describe_table(TableName=local.table_name)["Table"]
    assert table["StreamSpecification"] == {
        "StreamEnabled": True,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    assert table["LatestStreamArn"] == local.table_stream_arn
    assert [index["IndexName"] for index in table["GlobalSecondaryIndexes"]] == ["SequenceIndex"]

    sqs = local.client("sqs")
    recheck = sqs.get_queue_attributes(QueueUrl=local.recheck_queue_url, AttributeNames=["All"])
    dead_letter = sqs.get_queue_attributes(
        QueueUrl=local.recheck_dead_letter_queue_url, AttributeNames=["QueueArn"]
    )
    assert json.loads(recheck["Attributes"]["RedrivePolicy"]) == {
        "deadLetterTargetArn": dead_letter["Attributes"]["QueueArn"],
        "maxReceiveCount": 5,
    }
    assert recheck["Attributes"]["VisibilityTimeout"] == "360"
    sqs.get_queue_attributes(QueueUrl=local.stream_failure_queue_url, AttributeNames=["QueueArn"])

    local.client("sns").publish(TopicArn=local.alert_topic_arn, Message='{"kind": "drift"}')
    received = sqs.receive_message(QueueUrl=local.alert_inbox_url, WaitTimeSeconds=2)["Messages"]
    assert [json.loads(json.loads(m["Body"])["Message"]) for m in received] == [{"kind": "drift"}]


def test_the_processes_outlive_up_in_sessions_of_their_own(local: LocalStack) -> None:
    for pid in (local.dynamodb_pid, local.moto_pid):
        assert pid is not None
        assert os.getsid(pid) == pid  # so the terminal's Ctrl-C or hang-up never reaches them
    assert local.names()["Table"] == local.table_name
    assert local.names()["AlertTopic"] == local.alert_topic_arn


def test_the_exports_alone_point_plain_boto3_at_the_stack(
    local: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    exported = {}
    for line in exports(local).splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        [exported[name]] = shlex.split(value)
    assert set(exported) == EXPORTED
    for name in ("DYNAMODB_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in exported.items():
        monkeypatch.setenv(name, value)

    # A new session reads the environment now; no endpoint_url anywhere.
    session = boto3.Session()
    assert local.table_name in session.client("dynamodb").list_tables()["TableNames"]
    streams = session.client("dynamodbstreams").list_streams(TableName=os.environ["TABLE_NAME"])
    assert [s["StreamArn"] for s in streams["Streams"]] == [local.table_stream_arn]
    session.client("sns").get_topic_attributes(TopicArn=os.environ["ALERT_TOPIC_ARN"])
    session.client("sqs").get_queue_attributes(QueueUrl=os.environ["ALERT_INBOX_URL"])
    # The repair switches, as the template's parameters make them: repairs on, budget 25.
    switches = session.client("ssm").get_parameter(Name=os.environ["REPAIR_SWITCHES_PARAMETER"])
    assert json.loads(switches["Parameter"]["Value"]) == {
        "repairs_enabled": True,
        "dry_run": False,
        "repair_budget": 25,
    }


def test_up_again_returns_the_running_stack_unchanged(local: LocalStack) -> None:
    again = up(local.state_dir)
    assert again.already_running
    assert replace(again, already_running=False) == local
    assert load(local.state_dir) == local


def test_down_leaves_alone_a_recorded_pid_that_runs_something_else(
    local: LocalStack, tmp_path: Path
) -> None:
    replace(local, state_dir=tmp_path, dynamodb_pid=os.getpid(), moto_pid=os.getpid()).save()
    assert down(tmp_path) == []
    assert not (tmp_path / STATE_FILE).exists()


def test_a_stale_stack_is_replaced_and_down_stops_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DYNAMODB_ENDPOINT", raising=False)
    first = up(tmp_path)
    assert first.dynamodb_pid is not None
    os.kill(first.dynamodb_pid, signal.SIGKILL)  # as if it crashed
    with contextlib.suppress(ChildProcessError):
        os.waitpid(first.dynamodb_pid, 0)

    # What the stale stack's subscriber received, and where its pump left the stream.
    first.client("sns").publish(TopicArn=first.alert_topic_arn, Message='{"kind": "drift"}')
    assert inbox.collect(first.client("sqs"), first.alert_inbox_url, tmp_path) != []
    (tmp_path / state.CHECKPOINT_FILE).write_text("{}")

    second = up(tmp_path)
    assert not second.already_running
    # None of it shows in the new stack: alerts and stream positions belonged to the old one.
    assert inbox.collect(second.client("sqs"), second.alert_inbox_url, tmp_path) == []
    assert not (tmp_path / state.CHECKPOINT_FILE).exists()
    assert {second.dynamodb_pid, second.moto_pid}.isdisjoint({first.dynamodb_pid, first.moto_pid})
    assert gone(first.moto_pid)  # the survivor of the stale stack was stopped

    stopped = down(tmp_path)
    assert stopped == [
        f"moto server (pid {second.moto_pid}, port {second.moto_port})",
        f"DynamoDB Local (pid {second.dynamodb_pid}, port {second.dynamodb_port})",
    ]
    assert second.dynamodb_pid is not None
    assert gone(second.dynamodb_pid) and gone(second.moto_pid)
    assert not (tmp_path / STATE_FILE).exists()
    assert not (tmp_path / state.ALERTS_FILE).exists()
    assert down(tmp_path) == []


@pytest.mark.parametrize("option", ["dynamodb_port", "moto_port"])
def test_a_requested_port_in_use_is_named(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DYNAMODB_ENDPOINT", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LocalStackError, match=f"port {port} .* already in use"):
            up(tmp_path, **{option: port})
    assert load(tmp_path) is None


def test_a_dynamodb_endpoint_is_used_and_left_running(
    dynamodb_endpoint: str, dynamodb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNAMODB_ENDPOINT", dynamodb_endpoint)
    try:
        stack = up(tmp_path)
        assert (stack.dynamodb_endpoint, stack.dynamodb_pid) == (dynamodb_endpoint, None)
        assert down(tmp_path) == [f"moto server (pid {stack.moto_pid}, port {stack.moto_port})"]
        assert stack.table_name in dynamodb.list_tables()["TableNames"]
        # Its tables outlive `down`, so the next `up` finds them and keeps them.
        assert up(tmp_path).table_stream_arn == stack.table_stream_arn
        # A second stack on the same DynamoDB (the demo's) names its tables apart.
        other = up(tmp_path / "demo", prefix="tally-demo")
        assert other.table_name == "tally-demo-table"
        assert other.table_stream_arn != stack.table_stream_arn
        down(tmp_path / "demo")
        down(tmp_path)
    finally:
        for name in (
            "tally-local-table",
            "tally-local-audit",
            "tally-demo-table",
            "tally-demo-audit",
        ):
            with contextlib.suppress(dynamodb.exceptions.ResourceNotFoundException):
                dynamodb.delete_table(TableName=name)


def test_up_writes_the_sam_env_file_samconfig_reads(local: LocalStack) -> None:
    written = json.loads((local.state_dir / SAM_ENV_FILE).read_text())
    assert written == sam_env(local)
    assert written["ReconcilerFunction"]["TABLE_NAME"] == local.table_name


def test_the_exports_name_the_rules_the_template_bundles(
    local: LocalStack, template: dict[str, Any]
) -> None:
    assert stack_record.env(local)["RULES_FILE"] == str(bundled_rules(template))


def test_up_without_moto_names_the_extra_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = local_stack.importlib.util.find_spec
    monkeypatch.setattr(
        local_stack.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "moto" else find_spec(name, *args),
    )
    with pytest.raises(LocalStackError, match=r"pip install 'tally-reconciler\[local\]'"):
        up(tmp_path)
    assert load(tmp_path) is None


def test_the_demo_never_uses_or_stops_the_users_stack(
    local: LocalStack, dynamodb_endpoint: str, dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tally demo` next to a running stack: its own stack, state and names; the user's stays.

    The demo's stack uses the test run's DynamoDB (no second JVM), as a user's
    DYNAMODB_ENDPOINT would make both stacks share one.
    """
    from tally.cli import app as cli
    from tally.local import demo

    monkeypatch.setenv("TALLY_STATE_DIR", str(local.state_dir))
    monkeypatch.setenv("DYNAMODB_ENDPOINT", dynamodb_endpoint)
    seen: list[LocalStack] = []

    def story(stack: LocalStack, state_dir: Path, started: float) -> int:
        seen.append(stack)
        return 0

    monkeypatch.setattr(demo, "_demo", story)
    assert cli.main(["demo"]) == 0
    (ran,) = seen
    assert ran.state_dir == local.state_dir / "demo"
    assert (ran.table_name, ran.moto_pid) != (local.table_name, local.moto_pid)
    assert ran.table_name.startswith("tally-demo-")
    assert load(ran.state_dir) is None  # the demo stopped its own stack
    assert load(local.state_dir) == local and local_stack.answers(local)
    for name in (ran.table_name, ran.audit_table_name):
        dynamodb.delete_table(TableName=name)
