"""`tally local up --regions`: a multi-Region stack started and stopped with one command each,
driven as a user drives it (the CLI in processes of its own): a DynamoDB Local per Region
behind the replication emulator, each Region's resources, its variables, a pump per Region
running the real handlers in that Region, and alerts that say which Region they came from."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import psutil
import pytest

from tally.local.stack_record import LocalStack, load
from tally.local.stack_record import env as functions_env
from tests.integration.test_cli import clean_env, tally

TWO = "us-east-1,eu-west-1"
POST = {"PK": {"S": "POST#b7"}, "SK": {"S": "META"}}


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for a parent that is not the test counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def pids(stack: LocalStack) -> set[int]:
    assert stack.replication is not None
    started = {stack.moto_pid, stack.replication.pid}
    return started | {r.dynamodb_pid for r in (stack, *stack.replicas) if r.dynamodb_pid}


def client(stack: LocalStack, service: str = "dynamodb") -> Any:
    """A plain boto3 client of the Region, as a user's program builds it from the exports."""
    endpoint = stack.moto_endpoint if service in ("sns", "sqs") else stack.dynamodb_endpoint
    return boto3.client(
        service,  # type: ignore[call-overload]
        endpoint_url=endpoint,
        region_name=stack.region,
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )


def emulator(stack: LocalStack, action: str, body: dict[str, Any] | None = None) -> Any:
    import urllib.request

    request = urllib.request.Request(
        f"{stack.dynamodb_endpoint}/__emulator/{action}",
        data=json.dumps(body or {}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=90) as answer:
        return json.loads(answer.read())


def exported(env: dict[str, str], *region: str) -> tuple[dict[str, str], str]:
    result = tally("local", "env", *(("--region", *region) if region else ()), env=env)
    pairs = (line.removeprefix("export ").split("=", 1) for line in result.stdout.splitlines())
    return {name: value.strip("'") for name, value in pairs}, result.stderr


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, dict[str, str]]]:
    """Two Regions, started by a `tally local up --regions` that has exited since."""
    env = clean_env(tmp_path_factory.mktemp("regions"))
    started = tally("local", "up", "--regions", TWO, env=env)
    assert "local stack up: eventually consistent (MREC)" in started.stderr
    assert "replication lag median 300 ms, p99 2000 ms" in started.stderr
    stack = load(Path(env["TALLY_STATE_DIR"]))
    assert stack is not None
    yield stack, env
    tally("local", "down", env=env)


def test_two_regions_run_a_database_each_behind_the_emulator_and_replicate_the_counted_table(
    two: tuple[LocalStack, dict[str, str]],
) -> None:
    stack, env = two
    us, eu = stack, stack.in_region("eu-west-1")
    assert stack.regions == ["us-east-1", "eu-west-1"]
    assert us.dynamodb_pid != eu.dynamodb_pid and us.dynamodb_endpoint != eu.dynamodb_endpoint
    assert all(psutil.pid_exists(pid) for pid in pids(stack))
    for regional in (us, eu):
        names = client(regional).list_tables()["TableNames"]
        assert names == ["tally-local-audit", "tally-local-table"]  # the emulator's own hidden
        assert f":sns:{regional.region}:" in regional.alert_topic_arn
        queue = client(regional, "sqs").get_queue_attributes(
            QueueUrl=regional.recheck_queue_url, AttributeNames=["QueueArn"]
        )
        assert f":sqs:{regional.region}:" in queue["Attributes"]["QueueArn"]

    # The counted table replicates; the audit table is each Region's own.
    client(us).put_item(TableName=us.table_name, Item={**POST, "likeTally": {"N": "0"}})
    audit_item = {"PK": {"S": "AUDIT#x"}, "SK": {"S": "1"}}
    client(us).put_item(TableName=us.audit_table_name, Item=audit_item)
    emulator(us, "settle", {"timeout": 60})
    replicated = client(eu).get_item(TableName=eu.table_name, Key=POST, ConsistentRead=True)
    assert replicated["Item"] == {**POST, "likeTally": {"N": "0"}}  # no hidden stamp shown
    assert "Item" not in client(eu).get_item(TableName=eu.audit_table_name, Key=audit_item)

    again = tally("local", "up", "--regions", TWO, env=env)
    assert "local stack already running" in again.stderr
    other = tally("local", "up", env=env, expect=1)
    assert "the local stack runs Regions us-east-1, eu-west-1" in other.stderr
    assert "`tally local down` first" in other.stderr


def test_env_points_a_program_at_one_region(two: tuple[LocalStack, dict[str, str]]) -> None:
    stack, env = two
    eu = stack.in_region("eu-west-1")
    values, said = exported(env, "eu-west-1")
    assert said == ""
    assert values["AWS_ENDPOINT_URL_DYNAMODB"] == eu.dynamodb_endpoint
    assert values["AWS_DEFAULT_REGION"] == values["AWS_REGION"] == "eu-west-1"
    assert values["ALERT_TOPIC_ARN"] == eu.alert_topic_arn
    first, said = exported(env)
    assert first["AWS_DEFAULT_REGION"] == "us-east-1"
    assert first["AWS_ENDPOINT_URL_DYNAMODB"] == stack.dynamodb_endpoint
    assert "the variables of us-east-1, the first of the stack's Regions" in said
    refused = tally("local", "env", "--region", "ap-south-1", env=env, expect=2)
    assert "the local stack runs us-east-1, eu-west-1, not ap-south-1" in refused.stderr


def test_a_pump_per_region_runs_the_handlers_in_that_region_and_alerts_say_where(
    two: tuple[LocalStack, dict[str, str]],
) -> None:
    """Each Region's functions run as on a Global Table (GLOBAL_REGIONS): eu-west-1 reads from
    its own stream that its child was replaced by us-east-1's under the same key."""
    stack, env = two
    us, eu = stack, stack.in_region("eu-west-1")
    like = {"PK": {"S": "POST#b7"}, "SK": {"S": "LIKE#USER#1"}}

    def made_in(region: str, child_id: str) -> dict[str, Any]:
        return {**like, "tallyOrigin": {"S": region}, "tallyChildId": {"S": child_id}}

    # us-east-1 cut off while both Regions write the same child; us-east-1's is the later.
    emulator(us, "offline", {"region": "us-east-1"})
    client(eu).put_item(TableName=eu.table_name, Item=made_in("eu-west-1", "eu-west-1:a"))
    client(us).put_item(TableName=us.table_name, Item=made_in("us-east-1", "us-east-1:b"))
    emulator(us, "online", {"region": "us-east-1"})
    emulator(us, "settle", {"timeout": 60})

    pumped = tally("pump", "--region", "eu-west-1", "--until-idle", "--json", env=env)
    report = json.loads(pumped.stdout)
    assert (report["region"], report["state"], report["sent_to_failure_queue"]) == (
        "eu-west-1",
        "idle",
        0,
    )
    assert report["records"] >= 2
    # The real handler ran in eu-west-1: its context, its log, its topic.
    log = eu.state_dir / "functions.log"
    arns = {json.loads(line).get("function_arn") for line in log.read_text().splitlines()}
    assert "arn:aws:lambda:eu-west-1:000000000000:function:tally-local" in arns
    assert not (us.state_dir / "stream-checkpoint.json").exists()
    alerts = [json.loads(line) for line in tally("alerts", "--json", env=env).stdout.splitlines()]
    plain_like = {"PK": "POST#b7", "SK": "LIKE#USER#1"}
    holder = {"child_id": "us-east-1:b", "region": "us-east-1"}
    assert [(a["region"], a["kind"], a["key"], a["stored"], a["actual"]) for a in alerts] == [
        ("eu-west-1", "overwritten", plain_like, plain_like, holder)
    ]
    drawn = tally("alerts", env=env).stdout.splitlines()
    assert " ".join(drawn[1].split()) == "region kind rule parent stored actual severity repair"
    assert drawn[3].split()[:3] == ["eu-west-1", "overwritten", "likes"]

    # `tally pump` serves both Regions.
    both = tally("pump", "--until-idle", "--json", env=env)
    reports = {r["region"]: r for r in map(json.loads, both.stdout.splitlines())}
    assert set(reports) == {"us-east-1", "eu-west-1"}
    assert reports["us-east-1"]["records"] >= 1 and reports["us-east-1"]["idle"]
    assert "us-east-1: pump: idle." in both.stderr and "eu-west-1: pump: idle." in both.stderr


def test_an_operator_cannot_repair_a_global_table_by_hand(
    two: tuple[LocalStack, dict[str, str]],
) -> None:
    _, env = two
    refused = tally("audit", "--repair", env=env, expect=2)
    assert "is a Global Table (replicas in eu-west-1)" in refused.stderr
    assert "its repairs are the home Region's reconciler's" in refused.stderr
    assert "tally replay: table" in tally("replay", env=env, expect=2).stderr


def test_the_pumps_of_every_region_stop_together(two: tuple[LocalStack, dict[str, str]]) -> None:
    stack, env = two
    checkpoints = [r.state_dir / "stream-checkpoint.json" for r in (stack, *stack.replicas)]
    before = [path.read_text() for path in checkpoints]  # both Regions were pumped above
    pump = subprocess.Popen(
        [sys.executable, "-m", "tally.cli", "pump"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A write in each Region; once both checkpoints moved, both pumps are serving.
        for n, regional in enumerate((stack, *stack.replicas)):
            item = {"PK": {"S": f"POST#z{n}"}, "SK": {"S": "META"}, "likeTally": {"N": "0"}}
            client(regional).put_item(TableName=regional.table_name, Item=item)
        deadline = time.monotonic() + 120
        while any(p.read_text() == b for p, b in zip(checkpoints, before, strict=True)):
            assert pump.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        children = psutil.Process(pump.pid).children()
        regions = {child.cmdline()[child.cmdline().index("--region") + 1] for child in children}
        assert regions == {"us-east-1", "eu-west-1"}
        pump.send_signal(signal.SIGTERM)
        assert pump.wait(timeout=90) == 128 + signal.SIGTERM
        assert all(gone(child.pid) for child in children)
    finally:
        if pump.poll() is None:
            pump.kill()
    assert pump.stderr is not None
    said = pump.stderr.read()
    assert "us-east-1: pump: stopped." in said and "eu-west-1: pump: stopped." in said


def test_down_stops_every_process_of_the_regions(two: tuple[LocalStack, dict[str, str]]) -> None:
    stack, env = two
    stopped = tally("local", "down", env=env).stderr
    assert stopped.count("stopped: ") == 4  # moto, the emulator, two DynamoDB Locals
    assert all(gone(pid) for pid in pids(stack))
    assert load(stack.state_dir) is None


def test_three_regions_start_and_stop_with_one_command_each(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    tally(
        "local", "up", "--regions", "us-east-1,eu-west-1,ap-southeast-2", "--lag-ms", "0", env=env
    )
    stack = load(Path(env["TALLY_STATE_DIR"]))
    try:
        assert stack is not None and stack.replication is not None
        assert (stack.replication.lag_median_ms, stack.replication.lag_p99_ms) == (0, None)
        assert len({r.dynamodb_pid for r in (stack, *stack.replicas)}) == 3
        sydney = stack.in_region("ap-southeast-2")
        client(sydney).put_item(TableName=sydney.table_name, Item=POST)
        emulator(sydney, "settle", {"timeout": 60})
        for regional in (stack, *stack.replicas):
            assert client(regional).get_item(TableName=regional.table_name, Key=POST)["Item"]
    finally:
        tally("local", "down", env=env)
    assert stack is not None and all(gone(pid) for pid in pids(stack))


def test_the_strongly_consistent_profile_runs_three_regions_on_one_database(
    tmp_path: Path,
) -> None:
    env = clean_env(tmp_path)
    regions = "us-east-1,eu-west-1,ap-southeast-2"
    tally("local", "up", "--regions", regions, "--consistency", "strong", env=env)
    stack = load(Path(env["TALLY_STATE_DIR"]))
    try:
        assert stack is not None and stack.replication is not None
        assert stack.replication.consistency == "strong"
        records = (stack, *stack.replicas)
        assert len({(r.dynamodb_pid, r.dynamodb_port) for r in records}) == 1
        assert len({r.dynamodb_endpoint for r in records}) == 3  # a front each
        assert len({r.alert_topic_arn for r in records}) == 3
        us, sydney = stack, stack.in_region("ap-southeast-2")
        # No TTL on the counted table (MRSC has none), and a write is read at once elsewhere.
        ttl = client(us).describe_time_to_live(TableName=us.table_name)
        assert ttl["TimeToLiveDescription"]["TimeToLiveStatus"] == "DISABLED"
        client(us).put_item(TableName=us.table_name, Item=POST)
        assert client(sydney).get_item(TableName=sydney.table_name, Key=POST)["Item"] == POST
        with pytest.raises(client(us).exceptions.ClientError, match="Transactions are not"):
            client(sydney).transact_write_items(
                TransactItems=[{"Put": {"TableName": sydney.table_name, "Item": POST}}]
            )
        # Each Region's functions repair without a transaction on the table (its audit
        # table's transactions run).
        assert {functions_env(r)["GLOBAL_CONSISTENCY"] for r in records} == {"strong"}
        audit = {"PK": {"S": "LOG#1"}, "SK": {"S": "LOG"}}
        client(sydney).transact_write_items(
            TransactItems=[{"Put": {"TableName": sydney.audit_table_name, "Item": audit}}]
        )
    finally:
        tally("local", "down", env=env)
    assert stack is not None and all(gone(pid) for pid in pids(stack))
