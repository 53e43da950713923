"""The reconciler's stack for integration tests: DynamoDB Local with its real stream, SNS and
SQS from moto's server on loopback, and the real handlers invoked the way Lambda does."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from tally.cli import app as cli
from tally.core.settings import settings
from tally.core.streams import StreamReader, stream_arn
from tally.handlers import recheck as recheck_handler
from tally.handlers import reconciler as reconciler_handler
from tally.local import stack as local_stack
from tally.local import stack_record
from tally.local.dynamodb_local import local_client_kwargs
from tally.local.moto_server import moto_server
from tally.local.sqs_trigger import sqs_event_record
from tally.local.template import create_table
from tally.reconciler import runtime
from tally.reconciler.store.parts import Store
from tally.rules import load_rules
from tests.harness.adopting import EXAMPLES, Adopted
from tests.utils import deserialize, lambda_context, serialize

RULES_FILE = Path(__file__).with_name("rules.toml")

# Under pytest-xdist (`make integration`) whole files go to the workers in collection order
# (pyproject.toml's --dist=loadfile --no-loadscope-reorder): the files that take longest,
# as measured on two cores, go first, so the short ones fill in at the end instead of one
# long file running alone while the other workers wait. Without xdist the order is left as
# collected.
SLOWEST_FIRST = (
    "test_cli.py",
    "test_adopting_doc.py",
    "test_global_adopting_doc.py",
    "test_iam.py",
    "test_writers.py",
    "test_seeds.py",
    "test_adopting.py",
    "test_readme.py",
    "test_local_doc.py",
    "test_local_regions.py",
    "test_global_tables_emulator.py",
    "test_global_tables_losses.py",
    "test_mrsc_writers.py",
    "test_events.py",
    "test_local_stack.py",
    "test_writer_api_refusals.py",
    "test_writers_indexed.py",
    "test_number_domain.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        if item.path.parent == here and item.path.name in SLOWEST_FIRST:
            return SLOWEST_FIRST.index(item.path.name)
        return len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's server (SNS, SQS) on a free loopback port for the whole run."""
    with moto_server() as endpoint:
        yield endpoint


@dataclass
class Stack:
    """One test's tables, topic and queues, and the calls Lambda would make."""

    dynamodb: Any
    sqs: Any
    table: str
    audit_table: str
    topic_arn: str
    alert_queue: str
    recheck_queue: str
    reader: StreamReader
    responses: list[dict[str, Any]] = field(default_factory=list)

    def put(self, item: dict[str, Any]) -> None:
        self.dynamodb.put_item(TableName=self.table, Item=serialize(item))

    def delete(self, pk: str, sk: str) -> None:
        self.dynamodb.delete_item(TableName=self.table, Key=serialize({"PK": pk, "SK": sk}))

    def item(self, pk: str, sk: str) -> dict[str, Any] | None:
        response = self.dynamodb.get_item(
            TableName=self.table, Key=serialize({"PK": pk, "SK": sk}), ConsistentRead=True
        )
        return deserialize(response["Item"]) if "Item" in response else None

    def records(self) -> list[dict[str, Any]]:
        """Everything the stream holds that was not read yet, in Lambda's shape."""
        return self.reader.drain(limit=1000)

    def deliver(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Invoke the stream handler with one batch, as the event source mapping does."""
        response: dict[str, Any] = reconciler_handler.handler(
            {"Records": records}, lambda_context()
        )
        self.responses.append(response)
        return response

    def pump(self, batch_size: int = 100) -> list[dict[str, Any]]:
        """Read the stream and deliver it in batches; returns the records delivered."""
        records = self.records()
        for start in range(0, len(records), batch_size):
            self.deliver(records[start : start + batch_size])
        return records

    def pump_retrying(self, batch_size: int = 100, attempts: int = 20) -> int:
        """Like ``pump``, but a batch is retried from its first failed record, as Lambda does."""
        records = self.records()
        for start in range(0, len(records), batch_size):
            batch = records[start : start + batch_size]
            for _ in range(attempts):
                failed = self.deliver(copy.deepcopy(batch))["batchItemFailures"]
                if not failed:
                    break
                first = min(int(f["itemIdentifier"]) for f in failed)
                batch = [r for r in batch if int(r["dynamodb"]["SequenceNumber"]) >= first]
            else:
                raise AssertionError(f"a batch still failed after {attempts} deliveries")
        return len(records)

    def run_rechecks(self, strict: bool = True) -> int:
        """Deliver every due recheck message to the recheck handler; returns how many.

        ``strict``: no message may fail. Otherwise a failed one is made visible again at
        once, for the next call (SQS would after its visibility timeout).
        """
        delivered = 0
        while True:
            messages = self.sqs.receive_message(
                QueueUrl=self.recheck_queue, MaxNumberOfMessages=10, WaitTimeSeconds=0
            ).get("Messages", [])
            if not messages:
                return delivered
            event = {"Records": [sqs_event_record(m, self.recheck_queue) for m in messages]}
            response = recheck_handler.handler(event, lambda_context())
            failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
            assert not (strict and failed), response
            for message in messages:
                handle = message["ReceiptHandle"]
                if message["MessageId"] in failed:
                    self.sqs.change_message_visibility(
                        QueueUrl=self.recheck_queue, ReceiptHandle=handle, VisibilityTimeout=0
                    )
                else:
                    self.sqs.delete_message(QueueUrl=self.recheck_queue, ReceiptHandle=handle)
            delivered += len(messages) - len(failed)
            if failed:
                return delivered  # the next call retries them

    def settle(self, batch_size: int = 100, timeout: float = 90) -> None:
        """Pump the stream and rechecks until both are quiet (repairs make new records).

        Deferred rechecks wait out their real delay: the loop polls until none is pending.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            moved = self.pump(batch_size) or self.run_rechecks()
            if not moved and not self.pending_rechecks():
                return
            if not moved:
                time.sleep(0.5)
        raise AssertionError("the stream and the recheck queue never went quiet")

    def pending_rechecks(self) -> int:
        """Rechecks queued: due but not received yet, still delayed, or in flight."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.recheck_queue,
            # Visible too: a delay may run out between the receive and this call.
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesDelayed",
                "ApproximateNumberOfMessagesNotVisible",
            ],
        )["Attributes"]
        return sum(int(v) for v in attributes.values())

    def alerts(self) -> list[dict[str, Any]]:
        """Alert bodies the topic's subscriber queue received so far (consumed)."""
        bodies = []
        while True:
            messages = self.sqs.receive_message(
                QueueUrl=self.alert_queue, MaxNumberOfMessages=10, WaitTimeSeconds=0
            ).get("Messages", [])
            if not messages:
                return bodies
            for message in messages:
                bodies.append(json.loads(json.loads(message["Body"])["Message"]))
                self.sqs.delete_message(
                    QueueUrl=self.alert_queue, ReceiptHandle=message["ReceiptHandle"]
                )

    @property
    def audit(self) -> Store:
        return Store(self.dynamodb, self.audit_table)


def alerting(moto_endpoint: str, suffix: str) -> tuple[Any, str, str, str]:
    """The alert topic with a queue subscribed to it, and the recheck queue, on moto:
    (the SQS client, the topic's ARN, the alert queue's URL, the recheck queue's URL)."""
    local = {"endpoint_url": moto_endpoint, "region_name": "us-east-1"}
    sns, sqs = boto3.client("sns", **local), boto3.client("sqs", **local)
    topic_arn = sns.create_topic(Name=f"alerts-{suffix}")["TopicArn"]
    alert_queue = sqs.create_queue(QueueName=f"alerts-{suffix}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=alert_queue, AttributeNames=["QueueArn"])
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn["Attributes"]["QueueArn"])
    recheck_queue = sqs.create_queue(QueueName=f"rechecks-{suffix}")["QueueUrl"]
    return sqs, topic_arn, alert_queue, recheck_queue


def stack_environment(
    table: str,
    audit_table: str,
    topic_arn: str,
    recheck_queue: str,
    rules_file: Path,
    dynamodb_endpoint: str,
    moto_endpoint: str,
) -> dict[str, str]:
    """The handlers' environment for a stack of these tables, topic and queues."""
    return {
        "TABLE_NAME": table,
        "AUDIT_TABLE_NAME": audit_table,
        "ALERT_TOPIC_ARN": topic_arn,
        "RECHECK_QUEUE_URL": recheck_queue,
        "RULES_FILE": str(rules_file),
        "DYNAMODB_ENDPOINT": dynamodb_endpoint,
        "AWS_ENDPOINT_URL_SNS": moto_endpoint,
        "AWS_ENDPOINT_URL_SQS": moto_endpoint,
    }


@pytest.fixture
def stack(
    dynamodb: Any,
    dynamodb_streams: Any,
    dynamodb_endpoint: str,
    moto_endpoint: str,
    template: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Stack]:
    suffix = uuid.uuid4().hex[:10]
    table, audit_table = f"tally-it-{suffix}", f"tally-audit-{suffix}"
    create_table(dynamodb, template, "Table", table)
    create_table(dynamodb, template, "AuditTable", audit_table)
    sqs, topic_arn, alert_queue, recheck_queue = alerting(moto_endpoint, suffix)
    for name, value in stack_environment(
        table, audit_table, topic_arn, recheck_queue, RULES_FILE, dynamodb_endpoint, moto_endpoint
    ).items():
        monkeypatch.setenv(name, value)
    _clear_caches()
    streams = boto3.client("dynamodbstreams", **local_client_kwargs(dynamodb_endpoint))
    reader = StreamReader(streams, stream_arn(dynamodb, table))
    yield Stack(dynamodb, sqs, table, audit_table, topic_arn, alert_queue, recheck_queue, reader)
    _clear_caches()
    for name in (table, audit_table):
        dynamodb.delete_table(TableName=name)


@pytest.fixture
def repair_switches(
    stack: Stack, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The stack's repair switches parameter on moto's server, as the template makes it
    (repairs on, budget 25), read afresh by every invocation (max age 0); its name."""
    from tally.reconciler.repair.switches import Switches

    name = f"/tally/it-{uuid.uuid4().hex[:8]}/repair-switches"
    ssm = boto3.client("ssm", endpoint_url=moto_endpoint, region_name="us-east-1")
    ssm.put_parameter(Name=name, Type="String", Value=Switches(True, False, 25, "").value())
    monkeypatch.setenv("REPAIR_SWITCHES_PARAMETER", name)
    monkeypatch.setenv("REPAIR_SWITCHES_MAX_AGE_SECONDS", "0")
    monkeypatch.setenv("SSM_ENDPOINT", moto_endpoint)
    _clear_caches()
    yield name
    _clear_caches()


def _clear_caches() -> None:
    settings.cache_clear()
    runtime.rules.cache_clear()
    runtime._clients.cache_clear()
    runtime._switch_parameter.cache_clear()
    runtime.global_mode.cache_clear()


@pytest.fixture
def adopt(
    tmp_path: Path,
    dynamodb_endpoint: str,
    dynamodb: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[Callable[..., Adopted]]:
    state_dir = tmp_path / "state"
    monkeypatch.setenv("DYNAMODB_ENDPOINT", dynamodb_endpoint)
    monkeypatch.setenv("TALLY_STATE_DIR", str(state_dir))
    monkeypatch.delenv("RULES_FILE", raising=False)

    def start(
        shape: str, table_id: str, *, spawn: bool = False, rules: Path | None = None
    ) -> Adopted:
        """The example ``shape``'s table, with its rules or the ``rules`` file given."""
        rules = rules or EXAMPLES / shape / "rules.toml"
        args = ["local", "up", "--rules", str(rules)]
        args += ["--template", str(EXAMPLES / shape / "template.yaml"), "--table-id", table_id]
        if spawn:
            subprocess.run(
                [sys.executable, "-m", "tally.cli", *args],
                env=os.environ,
                check=True,
                capture_output=True,
                timeout=120,
            )
        else:
            assert cli.main(args) == 0
        stack = stack_record.load(state_dir)
        assert stack is not None and stack.rules_file == str(rules)
        return Adopted(stack, state_dir, load_rules(rules), capsys)

    try:
        yield start
    finally:
        started = stack_record.load(state_dir)
        local_stack.down(state_dir)
        tables = (started.table_name, started.audit_table_name) if started else ()
        for table in tables:
            with contextlib.suppress(dynamodb.exceptions.ResourceNotFoundException):
                dynamodb.delete_table(TableName=table)
