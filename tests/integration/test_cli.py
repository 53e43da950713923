"""The local contract, driven the way a user (and our acceptance checks) drive it: the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tally.local.stack import load
from tally.local.template import TEMPLATE_PATH, load_template


def tally(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tally.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=check,
    )


@pytest.fixture
def cli_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    # A user's shell: no endpoints, and none of the Powertools settings the tests run with.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_ENDPOINT_URL", "DYNAMODB", "POWERTOOLS_"))
    }
    env["TALLY_STATE_DIR"] = str(tmp_path / "state")
    tally("local", "up", env=env)
    yield env
    tally("local", "down", env=env)


def exported(env: dict[str, str]) -> dict[str, str]:
    lines = tally("local", "env", env=env).stdout.splitlines()
    pairs = (line.removeprefix("export ").split("=", 1) for line in lines)
    return {name: value.strip("'") for name, value in pairs}


def test_a_user_session_on_the_local_stack(cli_env: dict[str, str]) -> None:
    local = exported(cli_env)
    for name in (
        "AWS_ENDPOINT_URL_DYNAMODB",
        "AWS_ENDPOINT_URL_DYNAMODB_STREAMS",
        "AWS_ENDPOINT_URL_SNS",
        "AWS_ENDPOINT_URL_SQS",
        "AWS_DEFAULT_REGION",
        "TABLE_NAME",
        "AUDIT_TABLE_NAME",
        "ALERT_TOPIC_ARN",
    ):
        assert local[name], name
    # Any boto3 program talks to the local stack through those variables alone.
    session = dict(cli_env) | local
    script = (
        "import boto3, os; t = os.environ['TABLE_NAME']; d = boto3.client('dynamodb');"
        "d.put_item(TableName=t, Item={'PK': {'S': 'POST#a91f'}, 'SK': {'S': 'META'},"
        " 'likeTally': {'N': '5'}});"
        "d.put_item(TableName=t, Item={'PK': {'S': 'POST#a91f'}, 'SK': {'S': 'LIKE#USER#1'}})"
    )
    subprocess.run([sys.executable, "-c", script], env=session, check=True, timeout=60)

    pumped = tally("pump", "--until-idle", env=session)
    assert "idle" in pumped.stderr
    alerts = [
        json.loads(line) for line in tally("alerts", "--json", env=session).stdout.splitlines()
    ]
    assert [(a["kind"], a["key"], a["stored"], a["actual"]) for a in alerts] == [
        ("drift", {"PK": "POST#a91f", "SK": "META"}, 5, 1)
    ]
    assert alerts[0]["repair"]["status"] == "applied"  # likes repair automatically
    again = tally("alerts", "--json", env=session).stdout.splitlines()
    assert [json.loads(line) for line in again] == alerts  # alerts can be read again

    report = json.loads(tally("audit", "--json", env=session).stdout)
    assert report["findings"] == {} and report["parents_checked"]["likes"] == 1
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=local["AWS_ENDPOINT_URL_DYNAMODB"],
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    item = dynamodb.get_item(
        TableName=local["TABLE_NAME"], Key={"PK": {"S": "POST#a91f"}, "SK": {"S": "META"}}
    )["Item"]
    assert item["likeTally"] == {"N": "1"}

    # The export engine: the table in DynamoDB's export layout, audited by DuckDB.
    dynamodb.put_item(
        TableName=local["TABLE_NAME"],
        Item={"PK": {"S": "POST#a91f"}, "SK": {"S": "META"}, "likeTally": {"N": "7"}},
    )
    out = Path(cli_env["TALLY_STATE_DIR"]) / "exports"
    directory = Path(tally("export", "--out", str(out), env=session).stdout.strip())
    assert (
        directory.parent == out / "AWSDynamoDB" and (directory / "manifest-summary.json").exists()
    )
    audit = tally("audit", "--engine", "duckdb", "--export", str(out), "--json", env=session)
    report = json.loads(audit.stdout)
    assert (report["engine"], report["export"]["items"], report["candidates"]) == ("duckdb", 2, 1)
    assert report["findings"] == {"drift": 1} and report["repairs"] == {"dry_run": 1}


def test_the_pump_logs_as_the_template_says_and_stops_cleanly_on_sigterm(
    cli_env: dict[str, str],
) -> None:
    session = dict(cli_env) | exported(cli_env)
    script = (
        "import boto3, os; boto3.client('dynamodb').put_item(TableName=os.environ['TABLE_NAME'],"
        " Item={'PK': {'S': 'POST#b7'}, 'SK': {'S': 'LIKE#USER#1'}})"
    )
    subprocess.run([sys.executable, "-c", script], env=session, check=True, timeout=60)
    state = Path(cli_env["TALLY_STATE_DIR"])
    checkpoint = state / "stream-checkpoint.json"

    pump = subprocess.Popen(
        [sys.executable, "-m", "tally.cli", "pump"],
        env=session,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.exists():  # written once the first batch is handled
            assert pump.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        pump.send_signal(signal.SIGTERM)
        assert pump.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if pump.poll() is None:
            pump.kill()
    saved = json.loads(checkpoint.read_text())
    stack = load(state)
    assert stack is not None
    assert saved["streamArn"] == stack.table_stream_arn and saved["shards"]

    variables = load_template(TEMPLATE_PATH)["Globals"]["Function"]["Environment"]["Variables"]
    entries = [json.loads(line) for line in (state / "functions.log").read_text().splitlines()]
    logs = [e for e in entries if "_aws" not in e]
    metrics = [e for e in entries if "_aws" in e]
    assert logs and {e["service"] for e in logs} == {variables["POWERTOOLS_SERVICE_NAME"]}
    assert metrics
    for emf in metrics:
        [directive] = emf["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == variables["POWERTOOLS_METRICS_NAMESPACE"]
        assert all("service" in dimensions for dimensions in directive["Dimensions"])
        assert emf["service"] == variables["POWERTOOLS_SERVICE_NAME"]


def test_commands_that_need_the_stack_say_how_to_start_it(tmp_path: Path) -> None:
    env = dict(os.environ) | {"TALLY_STATE_DIR": str(tmp_path / "none")}
    result = tally("local", "env", env=env, check=False)
    assert result.returncode != 0
    assert "tally local up" in result.stderr
