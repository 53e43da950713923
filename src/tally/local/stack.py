"""The local stack behind `tally local up/down/env`: DynamoDB Local and moto's server (SNS,
SQS) as background processes that outlive the command, holding template.yaml's resources.

The counted table comes from template.yaml, from the user's own template (adopting an
existing table), or from the rules' key schema; the rules file the functions load is
recorded with the stack. `up` records what it started in ``<state dir>/local.json``;
`down` stops exactly that.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal

import boto3
import yaml
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tally.local import processes
from tally.local.dynamodb_local import JAR_NAME, DynamoDBLocalUnavailable, tail
from tally.local.dynamodb_local import command as dynamodb_command
from tally.local.functions import bundled_rules, functions
from tally.local.state import (
    ALERTS_FILE,
    CHECKPOINT_FILE,
    DYNAMODB_LOG,
    FUNCTION_LOG,
    MOTO_LOG,
    SAM_ENV_FILE,
    STATE_DIR_NAME,
    STATE_FILE,
)
from tally.local.template import (
    TemplateResourceError,
    create_table,
    create_table_from,
    create_table_kwargs,
    load_template,
    resource,
    rules_table_kwargs,
    template_path,
    time_to_live_attribute,
)
from tally.rules import load_rules
from tally.rules.live_table import TableShape, schema_problems

# Resource names are "<prefix>-<suffix>": a second stack on a shared DYNAMODB_ENDPOINT
# (the demo's) takes another prefix and never writes to the first one's tables.
PREFIX = "tally-local"
TABLE = "table"
AUDIT_TABLE = "audit"
ALERT_TOPIC = "alerts"
ALERT_INBOX = "alert-inbox"
RECHECK_QUEUE = "rechecks"
RECHECK_DEAD_LETTER_QUEUE = "rechecks-dead-letter"
STREAM_FAILURE_QUEUE = "stream-failures"
# Athena does not run locally: the audit query function only names the database in its SQL.
ATHENA_DATABASE = "tally_audit_local"

REGION = "us-east-1"
# Fixed dummy credentials, in clients and exports alike: no real key ever reaches a local
# endpoint, and a DynamoDB Local without -sharedDb (Docker's default) keys its database on them.
ACCESS_KEY_ID = "local"
SECRET_ACCESS_KEY = "local"

# Each process is recognised by an argument of its command line (and its port) before
# `down` signals it, so a pid reused by another program is never touched.
DYNAMODB_MARKER = JAR_NAME
MOTO_MARKER = "moto.server"

# Template properties that map one-to-one onto SNS/SQS attributes.
_TOPIC_ATTRIBUTES = frozenset({"DisplayName"})
_QUEUE_ATTRIBUTES = frozenset(
    {
        "DelaySeconds",
        "MaximumMessageSize",
        "MessageRetentionPeriod",
        "ReceiveMessageWaitTimeSeconds",
        "SqsManagedSseEnabled",
        "VisibilityTimeout",
    }
)
# Encryption with a customer key needs KMS, which local mode does not run.
_LOCALLY_IGNORED = frozenset({"KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds"})

_PROBE = Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1})
# Whether a recorded stack still answers: its processes run (checked first), so only a slow
# answer is left to wait for, and a busy machine must not pass for a stopped stack.
_ALIVE = Config(connect_timeout=2, read_timeout=10, retries={"total_max_attempts": 2})

Service = Literal["dynamodb", "dynamodbstreams", "sns", "sqs"]


class LocalStackError(RuntimeError):
    """The local stack cannot be started, read or stopped; the message says why."""


def default_state_dir() -> Path:
    """Where the project's local stack is recorded: .tally next to its template."""
    return template_path().parent / STATE_DIR_NAME


def _client(service: Service, endpoint: str, config: Config | None = None) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
        config=config,
    )


@dataclass(frozen=True)
class LocalStack:
    """What `up` started and created; everything but the last two fields is in the state file."""

    started_at: str
    dynamodb_endpoint: str
    # None when DYNAMODB_ENDPOINT named a DynamoDB that `up` did not start (nor `down` stops).
    dynamodb_pid: int | None
    dynamodb_port: int | None
    moto_endpoint: str
    moto_pid: int
    moto_port: int
    table_name: str
    table_stream_arn: str
    audit_table_name: str
    alert_topic_arn: str
    alert_inbox_url: str
    alert_subscription_arn: str
    recheck_queue_url: str
    recheck_dead_letter_queue_url: str
    stream_failure_queue_url: str
    state_dir: Path
    # True when `up` found this stack running and left it as it was.
    already_running: bool = False
    # The rules file the functions load (None: the bundled one) and where the table came from.
    rules_file: str | None = None
    table_source: str = ""

    def names(self) -> dict[str, str]:
        """Template logical id -> local name, ARN or URL: what ``Ref`` resolves to."""
        return {
            "Table": self.table_name,
            "AuditTable": self.audit_table_name,
            "AlertTopic": self.alert_topic_arn,
            "RecheckQueue": self.recheck_queue_url,
            "RecheckDeadLetterQueue": self.recheck_dead_letter_queue_url,
            "StreamFailureQueue": self.stream_failure_queue_url,
            "AuditDatabase": ATHENA_DATABASE,
        }

    def client(self, service: Service) -> Any:
        """A boto3 client for the service's local endpoint, with the dummy credentials."""
        endpoint = self.moto_endpoint if service in ("sns", "sqs") else self.dynamodb_endpoint
        return _client(service, endpoint)

    def save(self) -> None:
        """Write the state file, atomically so a concurrent reader never sees half of it."""
        state = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("state_dir", "already_running")
        }
        path = self.state_dir / STATE_FILE
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(state, indent=2) + "\n")
        staging.replace(path)


def load(state_dir: Path) -> LocalStack | None:
    """The stack recorded in the state directory, or None if there is none."""
    path = state_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
        return LocalStack(**state, state_dir=state_dir)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise LocalStackError(
            f"{path} is not a readable tally local state file ({exc}); "
            "stop the processes it names and remove it"
        ) from exc


def env(stack: LocalStack) -> dict[str, str]:
    """Environment variables that point boto3 programs and the handlers at the stack."""
    return {
        # boto3's own per-service endpoint variables: programs need no code change.
        "AWS_ENDPOINT_URL_DYNAMODB": stack.dynamodb_endpoint,
        "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": stack.dynamodb_endpoint,
        "AWS_ENDPOINT_URL_SNS": stack.moto_endpoint,
        "AWS_ENDPOINT_URL_SQS": stack.moto_endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "TABLE_NAME": stack.table_name,
        "AUDIT_TABLE_NAME": stack.audit_table_name,
        "ALERT_TOPIC_ARN": stack.alert_topic_arn,
        "RECHECK_QUEUE_URL": stack.recheck_queue_url,
        "STREAM_FAILURE_QUEUE_URL": stack.stream_failure_queue_url,
        "ALERT_INBOX_URL": stack.alert_inbox_url,
        # The stack's rules (`up --rules`), else those the template bundles with the functions.
        "RULES_FILE": stack.rules_file or str(bundled_rules(load_template(template_path()))),
    }


def sam_env(stack: LocalStack) -> dict[str, dict[str, str]]:
    """`sam local invoke --env-vars`: each function's declared variables, pointed at the stack.

    A container on the host network reaches the loopback endpoints; SAM ignores variables
    a function does not declare, so only those are set.
    """
    values = env(stack) | {
        "DYNAMODB_ENDPOINT": stack.dynamodb_endpoint,
        "SNS_ENDPOINT": stack.moto_endpoint,
        "SQS_ENDPOINT": stack.moto_endpoint,
        "ATHENA_DATABASE": ATHENA_DATABASE,
    }
    return {
        spec.logical_id: {name: values[name] for name in spec.environment if name in values}
        for spec in functions(load_template(template_path()))
    }


def exports(stack: LocalStack) -> str:
    """`env` as shell ``export`` lines, for ``eval "$(tally local env)"``; with them `sam`
    run by hand prints no telemetry banner, as under make."""
    values = env(stack) | {"SAM_CLI_TELEMETRY": "0"}
    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in values.items())


@dataclass(frozen=True)
class CountedTable:
    """The counted table's definition, checked against the rules before anything starts."""

    kwargs: dict[str, Any]
    ttl_attribute: str | None
    source: str


def counted_table(
    rules_file: Path | None, template: Path | None, table_id: str = "Table"
) -> CountedTable:
    """The table from ``template``'s ``table_id``, else from the rules' key schema when a
    rules file is given, else template.yaml's example table."""
    rules = load_rules(rules_file or bundled_rules(load_template(template_path())))
    if template is not None or rules_file is None:
        path = template or template_path()
        try:
            body = load_template(path)
            kwargs = create_table_kwargs(body, table_id, TABLE)
            ttl = time_to_live_attribute(body, table_id)
        except (OSError, ValueError, yaml.YAMLError, TemplateResourceError) as exc:
            raise LocalStackError(f"table {table_id!r} of {path}: {exc}") from exc
        except (KeyError, TypeError) as exc:
            raise LocalStackError(
                f"table {table_id!r} of {path}: local mode cannot read its {exc} "
                "(a plain value is needed, not an intrinsic function)"
            ) from exc
        table = CountedTable(kwargs, ttl, f"{path}#{table_id}")
    else:
        table = CountedTable(rules_table_kwargs(rules, TABLE), rules.table.ttl_attribute, "rules")
    problems = schema_problems(rules, replace(TableShape.of(table.kwargs), name=table.source))
    if problems:
        raise LocalStackError(
            f"{table.source} cannot hold these rules:\n  " + "\n  ".join(problems)
        )
    return table


def up(
    state_dir: Path,
    *,
    prefix: str = PREFIX,
    dynamodb_port: int | None = None,
    moto_port: int | None = None,
    startup_timeout: float = 60.0,
    rules_file: Path | None = None,
    template: Path | None = None,
    table_id: str = "Table",
    starting: Callable[[], None] = lambda: None,
) -> LocalStack:
    """Start the stack and create the template's resources, or return the running one;
    ``starting`` is called once everything is checked, before processes start.

    Ports default to free ones. A stack recorded in ``state_dir`` whose processes still
    answer is returned as is (``already_running``) if it holds the same table and rules;
    one whose processes are gone is replaced. With DYNAMODB_ENDPOINT set, that DynamoDB is
    used and no DynamoDB Local is started.
    """
    bundled = bundled_rules(load_template(template_path()))
    # The bundled rules named explicitly (`tally local env` exports them) are no rules of yours.
    rules_file = rules_file.resolve() if rules_file and rules_file.resolve() != bundled else None
    table = counted_table(rules_file, template.resolve() if template else None, table_id)
    existing = load(state_dir)
    if existing is not None:
        if answers(existing):
            wanted = (str(rules_file) if rules_file else None, table.source)
            if (existing.rules_file, existing.table_source) != wanted:
                raise LocalStackError(
                    f"the local stack runs table {existing.table_source} with rules "
                    f"{existing.rules_file or 'bundled'}; `tally local down` first"
                )
            return replace(existing, already_running=True)
        down(state_dir)  # stops whichever of its processes survived
    if importlib.util.find_spec("moto") is None:
        raise LocalStackError(
            "local mode runs SNS and SQS on moto's server, which is not installed: "
            "pip install 'tally-reconciler[local]'"
        )
    # Only DYNAMODB_ENDPOINT: AWS_ENDPOINT_URL_DYNAMODB may be a stale `tally local env` export.
    external = os.environ.get("DYNAMODB_ENDPOINT")
    if external and dynamodb_port is not None:
        raise LocalStackError(f"DYNAMODB_ENDPOINT={external} is set; no DynamoDB port to choose")
    starting()
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / FUNCTION_LOG).unlink(missing_ok=True)  # a new stack's log: its own lines only
    with contextlib.ExitStack() as held:
        moto_port = _reserve_port(held, "127.0.0.1", moto_port, "moto server")
        dynamodb: tuple[list[str], Path] | None = None
        if not external:
            # DynamoDB Local cannot bind loopback only, so the port must be free everywhere.
            dynamodb_port = _reserve_port(held, "", dynamodb_port, "DynamoDB Local")
            try:
                # Before anything starts, so a missing Java or npm leaves nothing behind.
                dynamodb = dynamodb_command(dynamodb_port)
            except DynamoDBLocalUnavailable as exc:
                raise LocalStackError(str(exc)) from exc

    started: list[int] = []
    try:
        moto_endpoint = f"http://127.0.0.1:{moto_port}"
        moto = _spawn(
            [sys.executable, "-m", MOTO_MARKER, "-H", "127.0.0.1", "-p", str(moto_port)],
            cwd=state_dir,
            log=state_dir / MOTO_LOG,
        )
        started.append(moto.pid)
        dynamodb_process = None
        if dynamodb is not None:
            command, cwd = dynamodb
            dynamodb_process = _spawn(command, cwd=cwd, log=state_dir / DYNAMODB_LOG)
            started.append(dynamodb_process.pid)
        dynamodb_endpoint = external or f"http://127.0.0.1:{dynamodb_port}"

        # Both start at once (moto ~1 s, the JVM ~3 s, more on a busy machine); wait for each.
        deadline = time.monotonic() + startup_timeout
        sqs = _client("sqs", moto_endpoint, _PROBE)
        _wait_ready("moto server", moto, state_dir / MOTO_LOG, sqs.list_queues, deadline)
        list_tables = partial(_client("dynamodb", dynamodb_endpoint, _PROBE).list_tables, Limit=1)
        if dynamodb_process is not None:
            log = state_dir / DYNAMODB_LOG
            _wait_ready("DynamoDB Local", dynamodb_process, log, list_tables, deadline)
        elif not _probe(list_tables):
            raise LocalStackError(f"DYNAMODB_ENDPOINT={external} does not answer")

        _forget(state_dir)
        stack = _create_resources(
            state_dir,
            prefix,
            table,
            dynamodb_endpoint=dynamodb_endpoint,
            dynamodb_pid=None if dynamodb_process is None else dynamodb_process.pid,
            dynamodb_port=dynamodb_port,
            moto_endpoint=moto_endpoint,
            moto_pid=moto.pid,
            moto_port=moto_port,
        )
        stack = replace(stack, rules_file=str(rules_file) if rules_file else None)
        stack.save()
        (state_dir / SAM_ENV_FILE).write_text(json.dumps(sam_env(stack), indent=2) + "\n")
    except BaseException:
        _stop(started, timeout=10.0)
        raise
    return stack


def down(state_dir: Path, timeout: float = 10.0) -> list[str]:
    """Stop the processes `up` recorded and remove the state file; returns what it stopped.

    A recorded pid that no longer runs the program `up` started is left alone.
    """
    stack = load(state_dir)
    if stack is None:
        return []
    ours = {
        pid: f"{name} (pid {pid}, port {port})"
        for name, pid, marker, port in _recorded(stack)
        if processes.runs(pid, marker, str(port))
    }
    _stop(list(ours), timeout)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    _forget(state_dir)
    return list(ours.values())


def _forget(state_dir: Path) -> None:
    """Remove what belonged to a stopped stack: its alerts never show in the next one."""
    for name in (ALERTS_FILE, CHECKPOINT_FILE, SAM_ENV_FILE):
        (state_dir / name).unlink(missing_ok=True)


def _recorded(stack: LocalStack) -> list[tuple[str, int, str, int]]:
    """(name, pid, command-line marker, port) of each process the stack started."""
    recorded = [("moto server", stack.moto_pid, MOTO_MARKER, stack.moto_port)]
    if stack.dynamodb_pid is not None and stack.dynamodb_port is not None:
        recorded.append(
            ("DynamoDB Local", stack.dynamodb_pid, DYNAMODB_MARKER, stack.dynamodb_port)
        )
    return recorded


def answers(stack: LocalStack) -> bool:
    """Whether the recorded processes are still ours and every endpoint answers."""
    if not all(processes.runs(pid, m, str(port)) for _, pid, m, port in _recorded(stack)):
        return False
    ddb = _client("dynamodb", stack.dynamodb_endpoint, _ALIVE)
    sqs = _client("sqs", stack.moto_endpoint, _ALIVE)
    return _probe(partial(ddb.list_tables, Limit=1)) and _probe(sqs.list_queues)


def _probe(call: Callable[[], object]) -> bool:
    try:
        call()
    except (BotoCoreError, ClientError):
        return False
    return True


def _reserve_port(held: contextlib.ExitStack, host: str, port: int | None, what: str) -> int:
    """Bind ``port`` (or a free one) and hold it until ``held`` closes; returns the port.

    Holding every port until all are chosen keeps two services from drawing the same one.
    """
    sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    try:
        sock.bind((host, port or 0))
    except OSError as exc:
        raise LocalStackError(
            f"port {port} for {what} is already in use ({exc.strerror}); "
            "choose another or stop what holds it"
        ) from exc
    chosen: int = sock.getsockname()[1]
    return chosen


def _spawn(command: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        # A session of its own: Ctrl-C or closing the terminal that ran `up` leaves it running.
        return subprocess.Popen(
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(
    name: str,
    process: subprocess.Popen[bytes],
    log: Path,
    probe: Callable[[], object],
    deadline: float,
) -> None:
    while True:
        if process.poll() is not None:
            raise LocalStackError(
                f"{name} exited with {process.returncode}; log {log}:\n{tail(log)}"
            )
        try:
            probe()
            return
        except BotoCoreError:
            if time.monotonic() > deadline:
                raise LocalStackError(
                    f"{name} did not answer in time; log {log}:\n{tail(log)}"
                ) from None
            time.sleep(0.1)


def _create_resources(
    state_dir: Path,
    prefix: str,
    counted: CountedTable,
    *,
    dynamodb_endpoint: str,
    dynamodb_pid: int | None,
    dynamodb_port: int | None,
    moto_endpoint: str,
    moto_pid: int,
    moto_port: int,
) -> LocalStack:
    """Create the counted table, the template's audit table, topic and queues, and the alert
    inbox subscribed to the topic."""
    template = load_template(template_path())

    def name(suffix: str) -> str:
        return f"{prefix}-{suffix}"

    dynamodb = _client("dynamodb", dynamodb_endpoint)
    table = _existing(dynamodb, name(TABLE))
    if table is None:
        kwargs = counted.kwargs | {"TableName": name(TABLE)}
        table = create_table_from(dynamodb, kwargs, counted.ttl_attribute)
    elif TableShape.of(table).keys != TableShape.of(counted.kwargs).keys:
        raise LocalStackError(
            f"{dynamodb_endpoint} keeps a table {name(TABLE)} with other keys than "
            f"{counted.source}; delete it first"
        )
    if _existing(dynamodb, name(AUDIT_TABLE)) is None:
        create_table(dynamodb, template, "AuditTable", name(AUDIT_TABLE))

    sns = _client("sns", moto_endpoint)
    sqs = _client("sqs", moto_endpoint)
    topic_properties = resource(template, "AlertTopic", "AWS::SNS::Topic").get("Properties", {})
    topic_arn: str = sns.create_topic(
        Name=name(ALERT_TOPIC),
        Attributes=_attributes("AlertTopic", topic_properties, _TOPIC_ATTRIBUTES),
    )["TopicArn"]
    arns: dict[str, str] = {}
    dead_letter_url = _queue(
        sqs, template, "RecheckDeadLetterQueue", name(RECHECK_DEAD_LETTER_QUEUE), arns
    )
    recheck_url = _queue(sqs, template, "RecheckQueue", name(RECHECK_QUEUE), arns)
    failure_url = _queue(sqs, template, "StreamFailureQueue", name(STREAM_FAILURE_QUEUE), arns)
    inbox_url: str = sqs.create_queue(QueueName=name(ALERT_INBOX))["QueueUrl"]
    subscription_arn: str = sns.subscribe(
        TopicArn=topic_arn,
        Protocol="sqs",
        Endpoint=_queue_arn(sqs, inbox_url),
        ReturnSubscriptionArn=True,
    )["SubscriptionArn"]
    return LocalStack(
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        table_name=name(TABLE),
        table_stream_arn=table["LatestStreamArn"],
        audit_table_name=name(AUDIT_TABLE),
        alert_topic_arn=topic_arn,
        alert_inbox_url=inbox_url,
        alert_subscription_arn=subscription_arn,
        recheck_queue_url=recheck_url,
        recheck_dead_letter_queue_url=dead_letter_url,
        stream_failure_queue_url=failure_url,
        dynamodb_endpoint=dynamodb_endpoint,
        dynamodb_pid=dynamodb_pid,
        dynamodb_port=dynamodb_port,
        moto_endpoint=moto_endpoint,
        moto_pid=moto_pid,
        moto_port=moto_port,
        state_dir=state_dir,
        table_source=counted.source,
    )


def _existing(client: Any, name: str) -> dict[str, Any] | None:
    """A table a DYNAMODB_ENDPOINT of the user's kept across `down`, if there is one."""
    try:
        table: dict[str, Any] = client.describe_table(TableName=name)["Table"]
    except client.exceptions.ResourceNotFoundException:
        return None
    return table


def _queue(
    sqs: Any, template: dict[str, Any], logical_id: str, name: str, arns: dict[str, str]
) -> str:
    """Create the template's queue as ``name`` and return its URL; ``arns`` gains its ARN.

    A redrive policy's dead-letter queue must be created first, so its ARN is in ``arns``.
    """
    properties = dict(resource(template, logical_id, "AWS::SQS::Queue").get("Properties", {}))
    redrive = properties.pop("RedrivePolicy", None)
    attributes = _attributes(logical_id, properties, _QUEUE_ATTRIBUTES)
    if redrive is not None:
        target, _ = redrive["deadLetterTargetArn"]["Fn::GetAtt"]
        attributes["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": arns[target],
                "maxReceiveCount": int(redrive["maxReceiveCount"]),
            }
        )
    url: str = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arns[logical_id] = _queue_arn(sqs, url)
    return url


def _queue_arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return arn


def _attributes(
    logical_id: str, properties: Mapping[str, Any], supported: frozenset[str]
) -> dict[str, str]:
    """The properties as SNS/SQS attributes; an error for any local mode cannot honour."""
    unsupported = set(properties) - supported - _LOCALLY_IGNORED
    if unsupported:
        raise LocalStackError(
            f"local mode cannot create {logical_id} with {', '.join(sorted(unsupported))}; "
            "teach tally.local.stack that property"
        )
    return {
        key: str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in properties.items()
        if key in supported
    }


def _stop(pids: list[int], timeout: float) -> None:
    survivors = processes.stop(pids, timeout)
    if survivors:
        raise LocalStackError(f"processes {survivors} did not exit after SIGKILL")
