"""The reconciler on a strongly consistent Global Table (MRSC), three emulated Regions: a child
written without its counter's bump (a writer that died between its two writes: MRSC refuses
the transaction that would have made them one) is repaired by the home Region with no
transaction on the table, the repair written apart (docs/verification.md, "Global Tables");
the other Regions write and alert nothing; a crash at each step of the repair leaves what the
docs say, and a redelivery finishes the job with no second write."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError

from tally.core.streams import StreamReader
from tally.handlers import recheck as recheck_handler
from tally.local.replication.emulator import Emulator, Settings
from tally.local.sqs_trigger import sqs_event_record
from tally.local.template import create_table, create_table_from, create_table_kwargs
from tally.reconciler import runtime
from tally.reconciler.protocol.judgement import ParentState
from tally.reconciler.table.tally_table import TallyTable
from tally.rules import REPAIR_MARKER, load_rules
from tests.harness.regions import AP, EU, US, client
from tests.integration.conftest import RULES_FILE, Stack, stack_environment
from tests.integration.conftest import _clear_caches as clear_caches
from tests.utils import deserialize, lambda_context, serialize

REGIONS = (US, EU, AP)
POST = {"PK": "POST#1", "SK": "META"}
TRANSACTIONS = ("TransactWriteItems", "TransactGetItems", "ExecuteTransaction")
WRITES = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", *TRANSACTIONS)


class Crash(Exception):
    """The function dies here (Lambda's retry redelivers its message)."""


@dataclass
class Calls:
    """What one Region's reconciler asked of DynamoDB: every request's operation and tables,
    the writes that succeeded, and a crash armed at one point of a repair."""

    table: str
    asked: list[tuple[str, set[str]]] = field(default_factory=list)
    applied: list[tuple[str, set[str]]] = field(default_factory=list)
    crash: str | None = None

    def before(self, params: dict[str, Any], model: Any, context: Any, **_: Any) -> None:
        tables = _tables(model.name, params)
        self.asked.append((model.name, tables))
        context["tally_call"] = (model.name, tables, params)
        crash = self.crash
        if crash == "after the marker's record" and self._repair_write(model.name, tables):
            self.crash = None
            raise Crash(crash)

    def after(self, http_response: Any, model: Any, context: Any, **_: Any) -> None:
        name, tables, params = context.get("tally_call", (model.name, set(), {}))
        if http_response.status_code != 200:
            return
        self.applied.append((name, tables))
        crash = self.crash
        if crash == "after the write" and self._repair_write(name, tables):
            self.crash = None
            raise Crash(crash)
        finishing = name == "TransactWriteItems" and "MARKER#" in str(params)
        if crash == "after the audit items" and finishing:
            self.crash = None
            raise Crash(crash)

    def _repair_write(self, name: str, tables: set[str]) -> bool:
        return name == "UpdateItem" and self.table in tables

    def writes_to_table(self) -> list[str]:
        return [name for name, tables in self.applied if name in WRITES and self.table in tables]

    def transactions_on_table(self) -> list[str]:
        return [
            name for name, tables in self.asked if name in TRANSACTIONS and self.table in tables
        ]

    def transactions(self) -> list[str]:
        return [name for name, _ in self.asked if name in TRANSACTIONS]


def _tables(name: str, params: dict[str, Any]) -> set[str]:
    if name == "ExecuteTransaction":
        return {s["Statement"] for s in params.get("TransactStatements", [])}
    if name in ("TransactWriteItems", "TransactGetItems"):
        return {d["TableName"] for item in params["TransactItems"] for d in item.values()}
    if name in ("BatchWriteItem", "BatchGetItem"):
        return set(params.get("RequestItems", {}))
    return {params["TableName"]} if "TableName" in params else set()


@dataclass
class Mrsc:
    """A counted table on an MRSC emulator and each Region's functions: its audit table, topic,
    queues, stream reader and environment, and what its DynamoDB client was asked."""

    table: str
    client: Any  # a writer's, in the home Region
    stacks: dict[str, Stack]
    environments: dict[str, dict[str, str]]
    calls: dict[str, Calls]
    monkeypatch: pytest.MonkeyPatch

    def functions(self, region: str) -> Stack:
        """Run what follows as ``region``'s functions (its environment, a fresh client that
        records its calls)."""
        for name, value in self.environments[region].items():
            self.monkeypatch.setenv(name, value)
        clear_caches()
        events = runtime._clients()[0].meta.events  # the client the handlers will use
        events.register("before-parameter-build.dynamodb", self.calls[region].before)
        events.register("after-call.dynamodb", self.calls[region].after)
        return self.stacks[region]

    def post(self) -> dict[str, Any]:
        found = self.client.get_item(TableName=self.table, Key=serialize(POST), ConsistentRead=True)
        return deserialize(found["Item"])

    def audit(self, region: str, prefix: str) -> list[dict[str, Any]]:
        stack = self.stacks[region]
        items = stack.dynamodb.scan(TableName=stack.audit_table, ConsistentRead=True)["Items"]
        return [
            deserialize(i)
            for i in items
            if i["SK"]["S"].startswith(prefix) or i["PK"]["S"].startswith(prefix)
        ]

    def child_without_its_counter(self) -> None:
        """A post with one like counted, then a like whose writer died before its counter."""
        self.client.put_item(
            TableName=self.table, Item=serialize({**POST, "likeTally": 0, "tallyRevision": 0})
        )
        self.like(1)
        self.client.update_item(
            TableName=self.table,
            Key=serialize(POST),
            UpdateExpression="ADD likeTally :one, tallyRevision :one",
            ExpressionAttributeValues=serialize({":one": 1}),
        )
        self.like(2)  # its counter's bump never comes

    def like(self, user: int) -> None:
        item = {"PK": POST["PK"], "SK": f"LIKE#USER#{user}"}
        self.client.put_item(TableName=self.table, Item=serialize(item))


@pytest.fixture
def mrsc(
    dynamodb_endpoint: str,
    moto_endpoint: str,
    template: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Mrsc]:
    suffix = uuid.uuid4().hex[:10]
    table = f"tally-mrsc-{suffix}"
    emulator = Emulator(
        Settings(dict.fromkeys(REGIONS, dynamodb_endpoint), [table], consistency="strong")
    ).start()
    try:
        fronts = {r: emulator.endpoint(r) for r in REGIONS}
        clients = {r: client("dynamodb", fronts[r], r) for r in REGIONS}
        # The counted table made once (one database), without TTL (MRSC refuses it).
        create_table_from(clients[US], create_table_kwargs(template, "Table", table), None)
        arn = clients[US].describe_table(TableName=table)["Table"]["LatestStreamArn"]
        stacks, environments = {}, {}
        for region in REGIONS:
            audit_table = f"tally-mrsc-audit-{suffix}-{region}"  # regional: each its own
            create_table(clients[region], template, "AuditTable", audit_table)
            sqs, topic_arn, alert_queue, recheck_queue = _alerting(moto_endpoint, suffix, region)
            reader = StreamReader(client("dynamodbstreams", fronts[region], region), arn, region)
            stacks[region] = Stack(
                clients[region],
                sqs,
                table,
                audit_table,
                topic_arn,
                alert_queue,
                recheck_queue,
                reader,
            )
            environments[region] = {
                **stack_environment(
                    table,
                    audit_table,
                    topic_arn,
                    recheck_queue,
                    RULES_FILE,
                    fronts[region],
                    moto_endpoint,
                ),
                "AWS_REGION": region,
                "AWS_DEFAULT_REGION": region,
                "GLOBAL_REGIONS": ",".join(REGIONS),
                "GLOBAL_CONSISTENCY": "strong",
                "SETTLE_SECONDS": "1",
            }
        calls = {r: Calls(table) for r in REGIONS}
        yield Mrsc(table, clients[US], stacks, environments, calls, monkeypatch)
    finally:
        clear_caches()
        emulator.stop()


def _alerting(moto_endpoint: str, suffix: str, region: str) -> tuple[Any, str, str, str]:
    """The Region's alert topic with a queue subscribed, and its recheck queue, on moto."""
    sns = client("sns", moto_endpoint, region)
    sqs = client("sqs", moto_endpoint, region)
    topic_arn = sns.create_topic(Name=f"alerts-{suffix}")["TopicArn"]
    alert_queue = sqs.create_queue(QueueName=f"alerts-{suffix}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=alert_queue, AttributeNames=["QueueArn"])
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn["Attributes"]["QueueArn"])
    recheck_queue = sqs.create_queue(QueueName=f"rechecks-{suffix}")["QueueUrl"]
    return sqs, topic_arn, alert_queue, recheck_queue


def until(done: Callable[[], bool], timeout: float = 60) -> None:
    """Poll (the second look waits out its settle window on the queue) until ``done``."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "never came"
        time.sleep(0.2)


def rechecks_surviving_a_crash(stack: Stack) -> None:
    """Deliver the due rechecks; an invocation that died (every record failed) leaves them
    on the queue, visible again (as its visibility timeout would)."""
    messages = stack.sqs.receive_message(
        QueueUrl=stack.recheck_queue, MaxNumberOfMessages=10, WaitTimeSeconds=0
    ).get("Messages", [])
    if not messages:
        return
    event = {"Records": [sqs_event_record(m, stack.recheck_queue) for m in messages]}
    try:
        failed = recheck_handler.handler(event, lambda_context())["batchItemFailures"]
    except BatchProcessingError:
        failed = [{"itemIdentifier": m["MessageId"]} for m in messages]
    retried = {f["itemIdentifier"] for f in failed}
    for message in messages:
        handle = message["ReceiptHandle"]
        if message["MessageId"] in retried:
            stack.sqs.change_message_visibility(
                QueueUrl=stack.recheck_queue, ReceiptHandle=handle, VisibilityTimeout=0
            )
        else:
            stack.sqs.delete_message(QueueUrl=stack.recheck_queue, ReceiptHandle=handle)


def repaired_alerts(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in alerts if a["kind"] == "drift" and a["repair"]["status"] == "applied"]


def test_a_child_without_its_counter_is_repaired_by_the_home_region_with_no_transaction_on_it(
    mrsc: Mrsc,
) -> None:
    mrsc.child_without_its_counter()
    home = mrsc.functions(US)
    home.settle()
    post = mrsc.post()
    assert post["likeTally"] == 2 and post["tallyRevision"] == 2
    [alert] = repaired_alerts(home.alerts())
    assert (alert["stored"], alert["actual"]) == (1, 2)
    calls = mrsc.calls[US]
    assert calls.transactions_on_table() == []
    assert calls.transactions()  # the hook saw the audit table's transactions: it is live
    assert calls.writes_to_table() == ["UpdateItem"]  # the fenced write, once
    [logged] = mrsc.audit(US, "REPAIR#")
    assert (logged["before"], logged["after"]) == (1, 2)
    [marker] = mrsc.audit(US, "MARKER#")
    assert "pending" not in marker and marker["PK"] == f"MARKER#{post[REPAIR_MARKER]}"
    # The other Regions read the same stream, the repair's record included: nothing.
    for region in (EU, AP):
        away = mrsc.functions(region)
        assert away.pump()
        away.settle()
        assert away.alerts() == []
        assert mrsc.calls[region].writes_to_table() == []
        assert mrsc.calls[region].transactions() == []
    assert mrsc.post() == post


def test_a_fence_that_fails_writes_nothing_and_the_parent_is_judged_again(mrsc: Mrsc) -> None:
    """A writer bumps the counter between the home Region's second recount and its write."""
    mrsc.child_without_its_counter()
    home = mrsc.functions(US)
    calls = mrsc.calls[US]
    raced: list[dict[str, Any]] = []

    def writer_first(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "UpdateItem" and params.get("TableName") == mrsc.table and not raced:
            mrsc.like(3)
            mrsc.client.update_item(
                TableName=mrsc.table,
                Key=serialize(POST),
                UpdateExpression="ADD likeTally :one, tallyRevision :one",
                ExpressionAttributeValues=serialize({":one": 1}),
            )
            raced.append(mrsc.post())

    runtime._clients()[0].meta.events.register_first(
        "before-parameter-build.dynamodb", writer_first
    )
    home.pump()
    until(lambda: [home.run_rechecks()] and bool(raced))
    assert mrsc.post() == raced[0]  # the fence held: nothing of the repair's was written
    assert REPAIR_MARKER not in raced[0] and raced[0]["likeTally"] == 2
    assert calls.writes_to_table() == []
    assert mrsc.audit(US, "REPAIR#") == [] and repaired_alerts(home.alerts()) == []
    home.settle()  # judged again from the new state, a settle window later
    post = mrsc.post()
    assert post["likeTally"] == 3 and calls.writes_to_table() == ["UpdateItem"]
    assert calls.transactions_on_table() == []


@pytest.mark.parametrize(
    ("crash", "written", "pending", "logged"),
    [
        ("after the marker's record", False, True, False),
        ("after the write", True, True, False),
        ("after the audit items", True, False, True),
    ],
)
def test_a_crash_in_a_repair_leaves_what_the_docs_say_and_a_redelivery_finishes_it_once(
    mrsc: Mrsc, crash: str, written: bool, pending: bool, logged: bool
) -> None:
    mrsc.child_without_its_counter()
    home = mrsc.functions(US)
    calls = mrsc.calls[US]
    calls.crash = crash
    home.pump()
    until(lambda: [rechecks_surviving_a_crash(home)] and calls.crash is None)
    post = mrsc.post()
    assert post["likeTally"] == (2 if written else 1)
    assert (REPAIR_MARKER in post) == written
    [marker] = mrsc.audit(US, "MARKER#")
    assert ("pending" in marker) == pending
    assert bool(mrsc.audit(US, "REPAIR#")) == logged
    assert bool(mrsc.audit(US, "OUTBOX")) == logged  # its alert waits in the outbox
    assert home.alerts() == []

    home.settle()  # the recheck redelivered, the repair's own record read
    post = mrsc.post()
    assert post["likeTally"] == 2 and post["tallyRevision"] == 2
    assert calls.writes_to_table() == ["UpdateItem"]  # one repair written, whatever the crash
    assert calls.transactions_on_table() == []
    [repair] = mrsc.audit(US, "REPAIR#")
    assert (repair["before"], repair["after"]) == (1, 2)
    if crash == "after the audit items":
        # As on any table: the alert committed, its publisher died; it is published once
        # its lease ran out (here made to), by the next flush.
        [held] = mrsc.audit(US, "OUTBOX")
        home.dynamodb.update_item(
            TableName=home.audit_table,
            Key=serialize({"PK": held["PK"], "SK": held["SK"]}),
            UpdateExpression="SET leaseUntil = :zero",
            ExpressionAttributeValues=serialize({":zero": 0}),
        )
        runtime.reconciler().flush_alerts()
    [alert] = repaired_alerts(home.alerts())
    assert (alert["stored"], alert["actual"]) == (1, 2)
    assert mrsc.audit(US, "OUTBOX") == []
    markers = mrsc.audit(US, "MARKER#")
    [finished] = [m for m in markers if "pending" not in m]
    assert finished["PK"] == f"MARKER#{post[REPAIR_MARKER]}"
    # A crash before the write leaves its marker's record unclaimed (it expires): no record
    # will ever carry that marker.
    orphans = [m for m in markers if "pending" in m]
    assert len(orphans) == (1 if crash == "after the marker's record" else 0)


def test_a_fenced_write_whose_answer_was_lost_is_known_as_applied_by_its_marker(
    mrsc: Mrsc,
) -> None:
    """The write alone has no transaction token: a retry of one that applied fails its own
    fence, and the item the failure shows, carrying this repair's marker, says it applied."""
    mrsc.child_without_its_counter()
    rules = load_rules(RULES_FILE)
    writes = TallyTable(mrsc.client, mrsc.table, rules).writes
    judged = ParentState(True, Decimal(1), Decimal(1))
    likes = rules["likes"]
    assert writes.set_counter(likes, POST, judged, Decimal(2), "r:first", None)
    assert writes.set_counter(likes, POST, judged, Decimal(2), "r:first", None)  # the retry
    assert not writes.set_counter(likes, POST, judged, Decimal(2), "r:other", None)
    post = mrsc.post()
    assert (post["likeTally"], post["tallyRevision"], post[REPAIR_MARKER]) == (2, 2, "r:first")
