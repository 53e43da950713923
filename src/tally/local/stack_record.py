"""The local stack's record: what `up` started and created, kept in ``<state dir>/local.json``,
and the variables that point boto3 programs, the handlers and `sam local invoke` at it."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import boto3
from botocore.config import Config

from tally.local.functions import bundled_rules, functions
from tally.local.state import REGIONS_DIR, STATE_DIR_NAME, STATE_FILE
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


def local_client(
    service: Service, endpoint: str, config: Config | None = None, region: str = REGION
) -> Any:
    """A boto3 client for a local endpoint, with the dummy credentials."""
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
        config=config,
    )


def region_dir(state_dir: Path, region: str) -> Path:
    """Where a multi-Region stack keeps a Region's alerts, checkpoint and functions' log (the
    first Region's are the state directory's own, as on a single-Region stack)."""
    return state_dir / REGIONS_DIR / region


@dataclass(frozen=True)
class Replication:
    """A multi-Region stack's emulator (``python -m tally.local.replication SETTINGS``): a
    DynamoDB endpoint per Region, replicating the counted table between them."""

    pid: int
    # Its settings file, the one argument of its command line: how `down` knows the process.
    settings: str
    consistency: str  # "eventual" (MREC) or "strong" (MRSC)
    # Each change's lag on a link: drawn (a median and a 99th percentile), fixed (no p99),
    # or none (strong).
    lag_median_ms: int | None = None
    lag_p99_ms: int | None = None
    # The Regions, in order (the first is every parent's home Region).
    regions: list[str] = field(default_factory=list)
    # How far a Region's clock runs ahead (negative: behind), in ms: last writer wins by it.
    skew_ms: dict[str, int] = field(default_factory=dict)

    def settle_seconds(self) -> int:
        """The reconciler's settle window: ten times the slowest lag the links are given
        (AWS's advice: ten times the recent maximum ReplicationLatency), 5 s at least."""
        slowest = self.lag_p99_ms or self.lag_median_ms or 0
        return max(5, -(-10 * slowest // 1000))

    def heartbeat_seconds(self) -> int:
        """How often each Region's pump beats, playing the HeartbeatFunction's schedule: a
        fifth of the settle window (AWS: once a minute), 1 s at least."""
        return max(1, self.settle_seconds() // 5)

    def global_env(self) -> dict[str, str]:
        """What the functions of each Region read to run as on a Global Table."""
        if not self.regions:
            return {}
        return {
            "GLOBAL_REGIONS": ",".join(self.regions),
            "SETTLE_SECONDS": str(self.settle_seconds()),
            "HEARTBEAT_SECONDS": str(self.heartbeat_seconds()),
            "GLOBAL_CONSISTENCY": self.consistency,
        }

    def describe(self) -> str:
        if self.consistency == "strong":
            return "strongly consistent (MRSC), one DynamoDB Local"
        skewed = "".join(f", {r}'s clock {ms:+d} ms" for r, ms in self.skew_ms.items())
        if self.lag_p99_ms is None:
            return f"eventually consistent (MREC), replication lag {self.lag_median_ms} ms{skewed}"
        return (
            f"eventually consistent (MREC), replication lag median {self.lag_median_ms} ms, "
            f"p99 {self.lag_p99_ms} ms{skewed}"
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
    # Its Region: always us-east-1 but on a multi-Region stack (`up --regions`).
    region: str = REGION
    # A multi-Region stack: its emulator, and the records of the Regions after the first (this
    # one is the first's). Its DynamoDB endpoint is then the emulator's front for the Region,
    # and ``dynamodb_pid``/``dynamodb_port`` the DynamoDB Local behind it.
    replication: Replication | None = None
    replicas: tuple[LocalStack, ...] = ()

    @property
    def regions(self) -> list[str]:
        return [self.region, *(replica.region for replica in self.replicas)]

    def in_region(self, region: str) -> LocalStack:
        """The stack as ``region`` sees it; LookupError saying which Regions it runs."""
        for stack in (self, *self.replicas):
            if stack.region == region:
                return stack
        raise LookupError(f"the local stack runs {', '.join(self.regions)}, not {region}")

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
        return local_client(service, endpoint, region=self.region)

    def _state(self) -> dict[str, Any]:
        """The fields of this Region's record; a single-Region stack's as they always were."""
        multi = ("region", "replication", "replicas")
        state = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("state_dir", "already_running", *multi)
        }
        if self.replication is not None:
            state["region"] = self.region
        return state

    def save(self) -> None:
        """Write the state file, atomically so a concurrent reader never sees half of it."""
        state = self._state()
        if self.replication is not None:
            state["replication"] = asdict(self.replication)
            state["replicas"] = [replica._state() for replica in self.replicas]
        path = self.state_dir / STATE_FILE
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(state, indent=2) + "\n")
        staging.replace(path)


def load(state_dir: Path) -> LocalStack | None:
    """The stack recorded in the state directory, or None if there is none."""
    path = state_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
        replication = state.pop("replication", None)
        replicas = state.pop("replicas", [])
        stack = LocalStack(**state, state_dir=state_dir)
        if replication is not None:
            shared = Replication(**replication)
            stack = replace(
                stack,
                replication=shared,
                replicas=tuple(
                    LocalStack(
                        **replica,
                        state_dir=region_dir(state_dir, replica["region"]),
                        replication=shared,
                    )
                    for replica in replicas
                ),
            )
        return stack
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
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
        "AWS_DEFAULT_REGION": stack.region,
        # A multi-Region stack's Region for the SDKs that read AWS_REGION (boto3 does not),
        # and the Global Table the functions run on (docs/global-tables.md).
        **({"AWS_REGION": stack.region} if stack.replication is not None else {}),
        **(stack.replication.global_env() if stack.replication is not None else {}),
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
