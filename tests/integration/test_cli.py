"""The local contract, driven the way a user (and our acceptance checks) drive it: the CLI,
as a separate process, with its exit codes (0 clean, 1 findings or failure, 2 usage)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tally.local.stack_record import load
from tally.local.template import load_template, template_path
from tests.integration.conftest import Stack

EVENTS = template_path().parent / "events"


def tally(
    *args: str, env: dict[str, str], expect: int = 0, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "tally.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == expect, (result.returncode, result.stdout, result.stderr)
    return result


def clean_env(tmp_path: Path) -> dict[str, str]:
    """This environment without local endpoints or targets, and a state dir of its own."""
    prefixes = ("AWS_ENDPOINT_URL", "DYNAMODB", "SNS_", "SQS_", "TABLE_NAME", "AUDIT_TABLE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.pop("RULES_FILE", None)
    env["TALLY_STATE_DIR"] = str(tmp_path / "state")
    return env


@pytest.fixture
def cli_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = clean_env(tmp_path)
    # A user's shell: none of the Powertools settings the tests run with either.
    env = {k: v for k, v in env.items() if not k.startswith("POWERTOOLS_")}
    tally("local", "up", env=env)
    yield env
    tally("local", "down", env=env)


def exported(env: dict[str, str]) -> dict[str, str]:
    lines = tally("local", "env", env=env).stdout.splitlines()
    pairs = (line.removeprefix("export ").split("=", 1) for line in lines)
    return {name: value.strip("'") for name, value in pairs}


def test_a_user_session_on_the_local_stack(cli_env: dict[str, str], tmp_path: Path) -> None:
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
    # samconfig's local_invoke reads the file `up` wrote (test_local_stack: = `env --sam`).
    sam = json.loads((tmp_path / "state" / "sam-env.json").read_text())
    assert sam["ReconcilerFunction"]["DYNAMODB_ENDPOINT"] == local["AWS_ENDPOINT_URL_DYNAMODB"]

    # Any boto3 program talks to the local stack through those variables alone.
    session = dict(cli_env) | local
    script = (
        "import boto3, os; t = os.environ['TABLE_NAME']; d = boto3.client('dynamodb');"
        "d.put_item(TableName=t, Item={'PK': {'S': 'POST#a91f'}, 'SK': {'S': 'META'},"
        " 'likeTally': {'N': '5'}});"
        "d.put_item(TableName=t, Item={'PK': {'S': 'POST#a91f'}, 'SK': {'S': 'LIKE#USER#1'}})"
    )
    subprocess.run([sys.executable, "-c", script], env=session, check=True, timeout=60)

    pumped = tally("pump", "--until-idle", "--json", env=session)
    assert "pump: idle." in pumped.stderr and "0 to the on-failure queue" in pumped.stderr
    report = json.loads(pumped.stdout)
    assert (report["state"], report["idle"], report["sent_to_failure_queue"]) == ("idle", True, 0)
    alerts = [
        json.loads(line) for line in tally("alerts", "--json", env=session).stdout.splitlines()
    ]
    assert [(a["kind"], a["key"], a["stored"], a["actual"]) for a in alerts] == [
        ("drift", {"PK": "POST#a91f", "SK": "META"}, 5, 1)
    ]
    assert alerts[0]["repair"]["status"] == "applied"  # likes repair automatically
    again = tally("alerts", "--json", env=session).stdout.splitlines()
    assert [json.loads(line) for line in again] == alerts  # alerts can be read again
    # Without --json: the table the audit draws, the whole key in its column.
    drawn = tally("alerts", env=session).stdout.splitlines()
    assert " ".join(drawn[1].split()) == "kind rule parent stored actual severity repair"
    assert " ".join(drawn[3].split()) == "drift likes PK=POST#a91f,SK=META 5 1 warning applied"

    report = json.loads(tally("audit", "--json", env=session).stdout)
    assert report["findings"] == {} and report["parents_checked"]["likes"] == 1
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=local["AWS_ENDPOINT_URL_DYNAMODB"],
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    key = {"PK": {"S": "POST#a91f"}, "SK": {"S": "META"}}
    assert dynamodb.get_item(TableName=local["TABLE_NAME"], Key=key)["Item"]["likeTally"] == {
        "N": "1"
    }

    # The export engine: the table in DynamoDB's export layout, audited by DuckDB.
    dynamodb.put_item(
        TableName=local["TABLE_NAME"],
        Item={"PK": {"S": "POST#a91f"}, "SK": {"S": "META"}, "likeTally": {"N": "7"}},
    )
    out = Path(cli_env["TALLY_STATE_DIR"]) / "exports"
    exported_ = tally("export", "--out", str(out), env=session)
    directory = Path(exported_.stdout.strip())
    assert (
        directory.parent == out / "AWSDynamoDB" and (directory / "manifest-summary.json").exists()
    )
    # The sentence whole on stderr; stdout holds the directory alone, for $(tally export ...).
    assert f"export: 2 items written to {directory}\n" in exported_.stderr
    as_json = json.loads(tally("export", "--out", str(out), "--json", env=session).stdout)
    assert as_json["items"] == 2 and Path(as_json["directory"]).parent == out / "AWSDynamoDB"
    audit = tally(
        "audit", "--engine", "duckdb", "--export", str(out), "--json", env=session, expect=1
    )
    report = json.loads(audit.stdout)
    assert (report["engine"], report["export"]["items"], report["candidates"]) == ("duckdb", 2, 1)
    assert report["findings"] == {"drift": 1} and report["repairs"] == {"dry_run": 1}

    # A rogue overwrite the stream has not delivered yet: the sample event finds it.
    dynamodb.update_item(
        TableName=local["TABLE_NAME"],
        Key=key,
        UpdateExpression="SET likeTally = :v",
        ExpressionAttributeValues={":v": {"N": "100"}},
    )
    event = EVENTS / "ReconcilerFunction" / "rogue_counter_overwrite.json"
    invoked = tally("invoke", "ReconcilerFunction", str(event), env=session)
    assert json.loads(invoked.stdout) == {"batchItemFailures": []}
    assert "invoke: ReconcilerFunction (tally.handlers.reconciler.handler) in process" in (
        invoked.stderr
    )
    assert "invoke: alerted: drift" in invoked.stderr and "stored 100 actual 1" in invoked.stderr

    # The audit table gone: every batch fails, retries run out, the pump says so and exits 1.
    dynamodb.put_item(
        TableName=local["TABLE_NAME"], Item={**key, "likeTally": {"N": "7"}, "x": {"S": "y"}}
    )
    dynamodb.delete_table(TableName=local["AUDIT_TABLE_NAME"])
    failed = tally("pump", "--until-idle", env=session, expect=1)
    assert "batches went to the on-failure queue: `tally replay` re-verifies them" in failed.stderr


def test_the_audit_exits_1_on_findings_lists_them_and_alerts_only_when_asked(
    stack: Stack, tmp_path: Path
) -> None:
    """On the environment's target (the fixture's tables), as `tally audit` without a stack."""
    env = dict(os.environ) | {"TALLY_STATE_DIR": str(tmp_path / "none")}
    stack.put({"PK": "POST#cli", "SK": "META", "likeTally": 4, "tallyRevision": 1})
    stack.put({"PK": "POST#cli", "SK": "LIKE#USER#1"})
    stack.put({"PK": "POST#fine", "SK": "META", "likeTally": 0})

    dry = tally("audit", env=env, expect=1)
    assert "drift" in dry.stdout and "PK=POST#cli,SK=META" in dry.stdout
    assert "would set likeTally 4 -> 1" in dry.stdout
    assert "dry run: nothing written, no alert published (--alert publishes)" in dry.stdout
    assert stack.alerts() == []
    assert stack.item("POST#cli", "META")["likeTally"] == 4  # type: ignore[index]

    tally("audit", "--alert", env=env, expect=1)
    assert [(a["kind"], a["repair"]["status"]) for a in stack.alerts()] == [("drift", "dry_run")]

    scoped = tally("audit", "--parent", "PK=POST#fine,SK=META", env=env)
    assert ": clean" in scoped.stdout

    repaired = tally("audit", "--repair", "--json", env=env, expect=1)
    report = json.loads(repaired.stdout)
    assert (report["findings"], report["repairs"]) == ({"drift": 1}, {"applied": 1})
    assert stack.item("POST#cli", "META")["likeTally"] == 1  # type: ignore[index]
    assert [a["repair"]["status"] for a in stack.alerts()] == ["applied"]
    clean = tally("audit", env=env)
    assert ": clean" in clean.stdout


def test_an_audit_of_a_parent_the_table_lacks_says_so(stack: Stack, tmp_path: Path) -> None:
    env = dict(os.environ) | {"TALLY_STATE_DIR": str(tmp_path / "none")}
    missing = tally("audit", "--parent", "PK=POST#nope,SK=META", env=env, expect=1)
    assert missing.stderr.startswith("tally: PK=POST#nope,SK=META: no such item in table"), (
        missing.stderr
    )
    assert missing.stdout == ""


def test_the_audit_says_what_it_waits_for_and_until_when(stack: Stack, tmp_path: Path) -> None:
    """Children without their parent are judged a grace period later (1 s in these rules)."""
    env = dict(os.environ) | {"TALLY_STATE_DIR": str(tmp_path / "none")}
    stack.put({"PK": "POST#gone", "SK": "LIKE#USER#1"})
    audited = tally("audit", env=env, expect=1)
    assert "audit: parentless children and sequences are judged a grace period later: " in (
        audited.stderr
    )
    assert "waiting 1 s, until " in audited.stderr and " UTC" in audited.stderr


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_an_unreachable_endpoint_is_named(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    env = clean_env(tmp_path) | {"TABLE_NAME": "t-table", "DYNAMODB_ENDPOINT": endpoint}
    for command in (["audit"], ["replay"]):
        result = tally(*command, env=env | {"STREAM_FAILURE_QUEUE_URL": "q"}, expect=1)
        assert result.stderr.startswith(f"tally: cannot reach {endpoint}"), result.stderr
        assert "tally local up" in result.stderr


def no_aws(tmp_path: Path) -> dict[str, str]:
    """No credentials and no region anywhere botocore looks (files, variables, metadata)."""
    env = clean_env(tmp_path)
    for name in list(env):
        if name.startswith("AWS_"):
            del env[name]
    return env | {
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def test_no_region_and_no_credentials_are_named(tmp_path: Path) -> None:
    env = no_aws(tmp_path)
    result = tally("audit", "--stack", "prod", env=env, expect=1)
    assert result.stderr.startswith("tally: no AWS region: set AWS_DEFAULT_REGION"), result.stderr
    region = {"AWS_DEFAULT_REGION": "eu-west-1"}
    result = tally("audit", "--stack", "prod", env=env | region, expect=1)
    assert result.stderr.startswith("tally: no AWS credentials: configure a profile")


def test_the_pump_logs_as_the_template_says_and_stops_cleanly_on_sigterm(
    cli_env: dict[str, str],
) -> None:
    session = dict(cli_env) | exported(cli_env)
    # A like written without its counter: a drift the handler finds and logs at once.
    script = (
        "import boto3, os; ddb, table = boto3.client('dynamodb'), os.environ['TABLE_NAME']\n"
        "ddb.put_item(TableName=table, Item={'PK': {'S': 'POST#b7'}, 'SK': {'S': 'META'},"
        " 'likeTally': {'N': '0'}})\n"
        "ddb.put_item(TableName=table, Item={'PK': {'S': 'POST#b7'}, 'SK': {'S': 'LIKE#USER#1'}})"
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

    variables = load_template(template_path())["Globals"]["Function"]["Environment"]["Variables"]
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


def test_each_stack_starts_its_functions_log_fresh_and_env_silences_sam(
    tmp_path: Path,
) -> None:
    env = clean_env(tmp_path)
    log = tmp_path / "state" / "functions.log"
    started = tally("local", "up", env=env)
    try:
        assert started.stderr.startswith("local stack: starting DynamoDB Local"), started.stderr
        log.write_text("this stack's line\n")
        again = tally("local", "up", env=env)  # already running: the same stack, the same log
        assert "starting" not in again.stderr and "already running" in again.stderr
        assert log.read_text() == "this stack's line\n"
        assert "export SAM_CLI_TELEMETRY=0" in tally("local", "env", env=env).stdout
        tally("local", "down", env=env)
        tally("local", "up", env=env)
        assert not log.exists() or "this stack's line" not in log.read_text()
    finally:
        tally("local", "down", env=env)


def test_commands_that_need_the_stack_say_how_to_start_it(tmp_path: Path) -> None:
    result = tally("local", "env", env=clean_env(tmp_path), expect=1)
    assert "tally local up" in result.stderr


def test_a_missing_or_broken_rules_file_stops_the_pump_before_it_reads_the_stream(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    session = dict(cli_env) | exported(cli_env)
    script = (
        "import boto3, os; d = boto3.client('dynamodb'); t = os.environ['TABLE_NAME'];"
        "d.put_item(TableName=t, Item={'PK': {'S': 'POST#c3'}, 'SK': {'S': 'META'},"
        " 'likeTally': {'N': '1'}});"
        "d.put_item(TableName=t, Item={'PK': {'S': 'POST#c3'}, 'SK': {'S': 'LIKE#USER#1'}})"
    )
    subprocess.run([sys.executable, "-c", script], env=session, check=True, timeout=60)
    state = Path(cli_env["TALLY_STATE_DIR"])

    missing = tally("pump", "--until-idle", "--rules", "/nope.toml", env=session, expect=2)
    assert missing.stderr.strip() == "tally: --rules /nope.toml: no such file"
    broken = tmp_path / "rules.toml"
    rules = (template_path().parent / "src" / "rules.toml").read_text()
    broken.write_text(rules.replace('counter = "likeTally"', 'countr = "likeTally"'))
    refused = tally("pump", "--until-idle", "--rules", str(broken), env=session, expect=2)
    assert refused.stderr.startswith(f"tally: rules file {broken}:")
    assert "rule 'likes' field 'countr'" in refused.stderr and "pump:" not in refused.stderr

    # Nothing was read, parked or checkpointed: the next pump delivers every record.
    stack = load(state)
    assert stack is not None
    sqs = stack.client("sqs")
    depth = sqs.get_queue_attributes(
        QueueUrl=stack.stream_failure_queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]["ApproximateNumberOfMessages"]
    assert depth == "0"
    assert not (state / "stream-checkpoint.json").exists()
    pumped = tally("pump", "--until-idle", env=session)
    assert "pump: idle. 2 records" in pumped.stderr
    assert "0 to the on-failure queue" in pumped.stderr
