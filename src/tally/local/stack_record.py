"""The local stack's record: what `up` started and created, kept in ``<state dir>/local.json``,
and the variables that point boto3 programs, the handlers and `sam local invoke` at it."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import boto3
from botocore.config import Config

from tally.local.functions import bundled_rules, functions
from tally.local.state import STATE_DIR_NAME, STATE_FILE
from tally.local.template import load_template, template_path

# Athena does not run locally: the audit query function only names the database in its SQL.
ATHENA_DATABASE = "tally_audit_local"

REGION = "us-east-1"
# Fixed dummy credentials, in clients and exports alike: no real key ever reaches a local
# endpoint, and a DynamoDB Local without -sharedDb (Docker's default) keys its database on them.
ACCESS_KEY_ID = "local"
SECRET_ACCESS_KEY = "local"

Service = Literal["dynamodb", "dynamodbstreams", "sns", "sqs", "ssm"]


class LocalStackError(RuntimeError):
    """The local stack cannot be started, read or stopped; the message says why."""


def default_state_dir() -> Path:
    """Where the project's local stack is recorded: .tally next to its template."""
    return template_path().parent / STATE_DIR_NAME


def local_client(service: Service, endpoint: str, config: Config | None = None) -> Any:
    """A boto3 client for a local endpoint, with the dummy credentials."""
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
    # The repair switches' SSM parameter, on moto's server ("" in a stack started before it).
    repair_switches_parameter: str = ""

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
            "RepairSwitches": self.repair_switches_parameter,
        }

    def client(self, service: Service) -> Any:
        """A boto3 client for the service's local endpoint, with the dummy credentials."""
        moto = service in ("sns", "sqs", "ssm")
        endpoint = self.moto_endpoint if moto else self.dynamodb_endpoint
        return local_client(service, endpoint)

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
        "AWS_ENDPOINT_URL_SSM": stack.moto_endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "TABLE_NAME": stack.table_name,
        "AUDIT_TABLE_NAME": stack.audit_table_name,
        "ALERT_TOPIC_ARN": stack.alert_topic_arn,
        "RECHECK_QUEUE_URL": stack.recheck_queue_url,
        "STREAM_FAILURE_QUEUE_URL": stack.stream_failure_queue_url,
        "ALERT_INBOX_URL": stack.alert_inbox_url,
        "REPAIR_SWITCHES_PARAMETER": stack.repair_switches_parameter,
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
        "SSM_ENDPOINT": stack.moto_endpoint,
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
