"""The local contract, driven the way a user (and our acceptance checks) drive it: the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest


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
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AWS_ENDPOINT_URL", "DYNAMODB"))
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


def test_commands_that_need_the_stack_say_how_to_start_it(tmp_path: Path) -> None:
    env = dict(os.environ) | {"TALLY_STATE_DIR": str(tmp_path / "none")}
    result = tally("local", "env", env=env, check=False)
    assert result.returncode != 0
    assert "tally local up" in result.stderr
