"""The live fault scenario: the application's writer threads write from a process of their
own (tests/harness/application.py), the pump verifies (at any ParallelizationFactor), an
injector breaks parents and code "not ours" deletes and reuses parents, while a subscriber
thread timestamps every alert as it reaches the topic's queue.

    run = LiveRun(stack, seed=1, factor=2, lifecycle=["batch-delete-project"])
    outcome = run.run()
    outcome.counts()  # false negatives, false positives, lost writes, harmful writes
    outcome.latency_table()  # per fault kind: count, median and max fault -> alert seconds

What is counted:
- false negative: a parent the injector broke that was never alerted;
- false positive: an alert on a parent nobody broke (a parent deleted, with its children
  or by a cascade, is not broken);
- lost write: an acknowledged write missing from the table, or a counter left unequal to
  its children on a parent that lives;
- harmful write: an item carrying the repair marker (``tallyRepair``) or a VOID under a
  parent that does not exist at the end or that the application deleted, or the parent
  item itself brought back by the reconciler after the application deleted it.

Latency is the time from the fault write's acknowledgement to the first alert on its parent
arriving in the subscriber's queue. The subscriber polls about twenty times a second.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3

from tally.core.settings import settings
from tally.handlers import recheck as recheck_handler
from tally.handlers import reconciler as reconciler_handler
from tally.local.pump import Pump
from tally.local.recheck_schedule import RecheckSchedule
from tally.local.stream_trigger import MappingSettings
from tally.local.template import load_template, template_path
from tally.reconciler import runtime
from tally.rules import REPAIR_MARKER, RuleSet
from tally.writers import SequenceAllocator, TallyWriter
from tests.harness.application import (
    HOT,
    LIVE_ORDER,
    POSTS,
    PROJECT,
    Acknowledged,
    Application,
    Writers,
)
from tests.utils import TTL_IDENTITY, deserialize, lambda_context, serialize

HOT_CHILDREN = 120  # a hot parent: more children than the 100 of a small one
ORDERS = [f"ORDER#sum{n}" for n in range(3)]
SEQUENCE_FAULT = "PROJECT#gap"
# Where a key's parent item sits, by its partition key's head.
PARENT_SK = {"POST#": "META", "ORDER#": "META", "PROJECT#": "COUNTER#ISSUE"}
# Lifecycle scenarios, each on parents of its own (see LiveRun.lifecycle_* methods).
LIFECYCLE = (
    "batch-delete-project",
    "transact-delete-project",
    "cascade-delete-post",
    "abandon-post",
    "reuse-post",
    "delete-order",
    "delete-during-carry",
    "delete-during-recheck",
    "recreate-in-grace",
    "ttl-parent",
)


@dataclass
class Fault:
    pk: str
    kind: str  # count, sum, sequence
    size: str  # small, hot
    at: float  # time.time() when the write was acknowledged


@dataclass
class Alert:
    at: float
    body: dict[str, Any]

    @property
    def pk(self) -> str:
        return str(self.body["key"]["PK"])


class Counted:
    """What a live run counts and how it is told (for an outcome dataclass with the fields
    false_negatives, false_positives, lost_writes, harmful_writes, latencies, alerts and
    seconds)."""

    false_negatives: set[str]
    false_positives: set[str]
    lost_writes: list[str]
    harmful_writes: list[str]
    latencies: dict[str, list[float]]
    alerts: list[dict[str, Any]]
    seconds: float

    def counts(self) -> tuple[int, int, int, int]:
        return (
            len(self.false_negatives),
            len(self.false_positives),
            len(self.lost_writes),
            len(self.harmful_writes),
        )

    def latency_table(self) -> dict[str, dict[str, float]]:
        return latency_table(self.latencies)

    def alert_pk(self, alert: dict[str, Any]) -> str:
        return str(alert["key"]["PK"])

    def counted_json(self) -> dict[str, Any]:
        return {
            "false_negatives": sorted(self.false_negatives),
            "false_positives": sorted(self.false_positives),
            "lost_writes": self.lost_writes,
            "harmful_writes": self.harmful_writes,
            "latency": self.latency_table(),
            "latencies": self.latencies,
            "seconds": round(self.seconds, 1),
            "alerts": [
                {k: a.get(k) for k in ("kind", "key", "rule", "stored", "actual", "detail")}
                for a in self.alerts
            ],
        }

    def counted_lines(self, run: str) -> list[str]:
        """The counts of the run named ``run``, what each names, the alerts that were false
        positives, and the latency table."""
        fn, fp, lost, harmful = self.counts()
        lines = [
            f"{run}: false negatives {fn}, false positives {fp}, "
            f"lost writes {lost}, harmful writes {harmful} ({self.seconds:.0f} s)"
        ]
        for name, what in (
            ("false negatives", sorted(self.false_negatives)),
            ("false positives", sorted(self.false_positives)),
            ("lost writes", self.lost_writes),
            ("harmful writes", self.harmful_writes),
        ):
            if what:
                lines.append(f"  {name}: {', '.join(what)}")
        for alert in self.alerts:
            if self.alert_pk(alert) in self.false_positives:
                lines.append(f"  false positive: {json.dumps(alert, default=str)[:400]}")
        lines.append(format_latency(self.latency_table()))
        return lines


@dataclass
class Outcome(Counted):
    """What one run counted."""

    factor: int
    false_negatives: set[str] = field(default_factory=set)
    false_positives: set[str] = field(default_factory=set)
    lost_writes: list[str] = field(default_factory=list)
    harmful_writes: list[str] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=dict)  # "count/small" -> seconds
    alerts: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"factor": self.factor, **self.counted_json()}

    def describe(self) -> str:
        return "\n".join(self.counted_lines(f"factor {self.factor}"))


def latency_table(latencies: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        kind: {
            "faults": len(values),
            "median": round(statistics.median(values), 3),
            "max": round(max(values), 3),
        }
        for kind, values in sorted(latencies.items())
        if values
    }


def format_latency(table: dict[str, dict[str, float]]) -> str:
    rows = ["  fault kind        faults  median s  max s"]
    rows += [
        f"  {kind:<17} {row['faults']:>6.0f}  {row['median']:>8.2f}  {row['max']:>5.2f}"
        for kind, row in table.items()
    ]
    return "\n".join(rows)


class Subscriber(threading.Thread):
    """Receives the alert queue continuously, timestamping each alert on arrival."""

    def __init__(self, sqs: Any, queue_url: str):
        super().__init__(name="alert-subscriber", daemon=True)
        self.sqs, self.queue_url = sqs, queue_url
        self.alerts: list[Alert] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if not self.receive():
                self.done.wait(0.05)
        while self.receive():
            pass

    def receive(self) -> int:
        messages = self.sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
        ).get("Messages", [])
        now = time.time()
        for message in messages:
            body = json.loads(json.loads(message["Body"])["Message"])
            self.alerts.append(Alert(now, body))
            self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        return len(messages)

    def stop(self) -> list[Alert]:
        self.done.set()
        self.join()
        return self.alerts


class TtlRemovals:
    """Stream records of the keys named here that are REMOVEs come from TTL, as DynamoDB
    marks them (DynamoDB Local's stream never does): the harness deletes the item itself."""

    def __init__(self) -> None:
        self.keys: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def expire(self, keys: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            self.keys.update(keys)

    def mark(self, event: dict[str, Any]) -> dict[str, Any]:
        event = copy.deepcopy(event)
        for record in event["Records"]:
            keys = record["dynamodb"]["Keys"]
            key = (keys["PK"]["S"], keys["SK"]["S"])
            if record["eventName"] == "REMOVE" and key in self.keys:
                record["userIdentity"] = dict(TTL_IDENTITY)
        return event


@dataclass
class Ledger:
    """What the application was told and did, and what the injector broke."""

    likes: dict[str, bool] = field(default_factory=dict)  # "PK/SK" -> present, as acknowledged
    lines: dict[str, Decimal] = field(default_factory=dict)
    numbers: int = 0
    faults: list[Fault] = field(default_factory=list)
    # Parents whose alert is optional (broken, then deleted before any judgement could end).
    either: set[str] = field(default_factory=set)
    # Parents the application deleted for good: nothing of the reconciler's may sit under them.
    gone: set[str] = field(default_factory=set)
    # Parents the application deleted and made again: they must balance at the end.
    reused: set[str] = field(default_factory=set)

    @property
    def broken(self) -> set[str]:
        return {f.pk for f in self.faults}


class LiveRun:
    """One run of the scenario on a fresh ``stack`` (tests.integration.conftest.Stack)."""

    def __init__(
        self,
        stack: Any,
        rules: RuleSet,
        *,
        seed: int = 1,
        factor: int = 1,
        lifecycle: Iterable[str] = LIFECYCLE,
        writers: int = 6,
        operations: int = 30,
        batch_size: int | None = None,
    ):
        self.stack, self.rules, self.seed = stack, rules, seed
        self.factor = factor
        self.lifecycle = list(lifecycle)
        unknown = set(self.lifecycle) - set(LIFECYCLE)
        if unknown:
            raise ValueError(f"unknown lifecycle scenarios: {sorted(unknown)}")
        self.writers, self.operations = writers, operations
        self.ledger = Ledger()
        self.lock = threading.Lock()
        self.ttl = TtlRemovals()
        self.invocations: list[tuple[float, float, int]] = []  # (start, seconds, records)
        self.tallies = TallyWriter(stack.dynamodb, stack.table, rules)
        self.numbers = SequenceAllocator(stack.dynamodb, stack.table, rules)
        # This process's own writes (the lifecycle scenarios'); the writer threads run in
        # the application's process (tests/harness/application.py).
        self.writes = Writers(self.tallies, self.numbers, seed, operations)
        settings = MappingSettings.from_template(
            load_template(template_path()), parallelization=factor, batch_size=batch_size
        )
        failures = stack.sqs.create_queue(QueueName=f"failures-{uuid.uuid4().hex[:8]}")
        self.pump = Pump(
            stack.reader,
            self.verify,
            lambda event: recheck_handler.handler(event, lambda_context()),
            stack.sqs,
            stack.recheck_queue,
            failures["QueueUrl"],
            settings,
            schedule=watched_schedule(),
            rechecks_beside=True,  # the handlers are called directly: they may overlap
        )

    # --- the run ------------------------------------------------------------------------

    def verify(self, event: dict[str, Any]) -> Any:
        """The stream handler, as the pump invokes it; each invocation's time is kept."""
        began = time.time()
        try:
            return reconciler_handler.handler(self.ttl.mark(event), lambda_context())
        finally:
            with self.lock:
                self.invocations.append((began, time.time() - began, len(event["Records"])))

    def run(self) -> Outcome:
        started = time.monotonic()
        self.setup()
        self.pump.until_idle(max_seconds=120)
        application = Application.start(
            self.stack.dynamodb.meta.endpoint_url,
            self.stack.table,
            settings().rules_file,
            seed=self.seed,
            writers=self.writers,
            operations=self.operations,
        )
        subscriber = Subscriber(self.stack.sqs, self.stack.alert_queue)
        subscriber.start()
        pumping = threading.Thread(target=self.pump.forever, name="pump")
        pumping.start()
        try:
            with ThreadPoolExecutor(1 + len(self.lifecycle)) as pool:
                application.go()
                jobs = [pool.submit(self.break_parents)]
                jobs += [
                    pool.submit(getattr(self, "lifecycle_" + name.replace("-", "_")))
                    for name in self.lifecycle
                ]
                for job in jobs:
                    job.result()
            self.acknowledge(application.result())
        finally:
            application.stop()
            self.pump.stop(1)
            pumping.join()
        self.acknowledge(self.writes.acknowledged)
        self.pump.stop_signal = None
        # Every pending recheck (carry, grace, deferral) comes due and runs.
        report = self.pump.until_idle(max_seconds=180, rechecks=True)
        alerts = subscriber.stop()
        outcome = self.judge(alerts)
        if not report.idle:
            outcome.lost_writes.append("the pump never went idle")
        outcome.seconds = time.monotonic() - started
        return outcome

    def acknowledge(self, acknowledged: Acknowledged) -> None:
        """What writers were told becomes the truth the run is judged against."""
        self.ledger.likes.update(acknowledged.likes)
        self.ledger.lines.update(acknowledged.lines)
        self.ledger.numbers += acknowledged.numbers

    # --- the application --------------------------------------------------------------

    def put(self, item: dict[str, Any]) -> None:
        self.stack.put(item)

    def batch(
        self, puts: Iterable[dict[str, Any]] = (), deletes: Iterable[tuple[str, str]] = ()
    ) -> None:
        requests = [{"PutRequest": {"Item": serialize(item)}} for item in puts]
        requests += [
            {"DeleteRequest": {"Key": serialize({"PK": pk, "SK": sk})}} for pk, sk in deletes
        ]
        for start in range(0, len(requests), 25):
            pending = {self.stack.table: requests[start : start + 25]}
            while pending:
                answer = self.stack.dynamodb.batch_write_item(RequestItems=pending)
                pending = answer.get("UnprocessedItems") or {}

    def likes_of(self, pk: str, count: int, tag: str = "OLD") -> list[dict[str, Any]]:
        return [{"PK": pk, "SK": f"LIKE#{tag}#{n:03d}"} for n in range(count)]

    def post(self, pk: str, likes: int, tag: str = "OLD") -> list[tuple[str, str]]:
        """A post with ``likes`` likes, its counter in step; returns every key written.

        Written in one transaction, as docs/verification.md asks of a parent created with
        its children; past a transaction's 100 items, in batches (the parent is then hot,
        and its creation is carried until the rest arrives)."""
        children = self.likes_of(pk, likes, tag)
        items = [{"PK": pk, "SK": "META", "likeTally": likes, "tallyRevision": 0}, *children]
        if len(items) <= 100:
            self.stack.dynamodb.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": self.stack.table, "Item": serialize(item)}}
                    for item in items
                ]
            )
        else:
            self.batch(items)
        return [(pk, "META"), *((c["PK"], c["SK"]) for c in children)]

    def setup(self) -> None:
        for pk in POSTS:
            self.post(pk, 0)
        self.post(HOT, HOT_CHILDREN)
        for pk in [*ORDERS, LIVE_ORDER]:
            self.put({"PK": pk, "SK": "META", "total": 0, "tallyRevision": 0})
        for pk in ORDERS:
            for n in range(3):
                self.tallies.add_child({"PK": pk, "SK": f"LINE#{n}"}, {"amount": Decimal("2.50")})
        for pk in (PROJECT, SEQUENCE_FAULT):
            self.numbers.allocate({"PK": pk, "SK": "COUNTER#ISSUE"}, strategy="gapless")
        self.ledger.numbers = 1

    def like(self, key: dict[str, str], add: bool) -> None:
        """A like or an unlike by the lifecycle scenarios' code (in this process)."""
        self.writes.like(key, add)

    # --- the injector -----------------------------------------------------------------

    def faulted(self, pk: str, kind: str, size: str) -> None:
        """The fault write on ``pk`` was just acknowledged."""
        with self.lock:
            self.ledger.faults.append(Fault(pk, kind, size, time.time()))

    def update(self, pk: str, sk: str, expression: str, values: dict[str, Any]) -> None:
        self.stack.dynamodb.update_item(
            TableName=self.stack.table,
            Key=serialize({"PK": pk, "SK": sk}),
            UpdateExpression=expression,
            ExpressionAttributeValues=serialize(values),
        )

    def set_total(self, pk: str, value: str) -> None:
        self.stack.dynamodb.update_item(
            TableName=self.stack.table,
            Key=serialize({"PK": pk, "SK": "META"}),
            UpdateExpression="SET #t = :v",
            ExpressionAttributeNames={"#t": "total"},
            ExpressionAttributeValues={":v": {"N": value}},
        )

    def break_parents(self) -> None:
        """Rogue writes, each on a parent of its own (so each must be alerted)."""
        rng = random.Random(self.seed)
        victims = rng.sample(POSTS, 6)
        for n, pk in enumerate(victims):
            time.sleep(rng.uniform(0.05, 0.3))
            if n % 3 == 0:  # a rogue counter overwrite to a value no truth can have
                self.update(pk, "META", "SET likeTally = :v", {":v": 1000 + n})
            elif n % 3 == 1:  # a rogue bump
                self.update(pk, "META", "ADD likeTally :k", {":k": rng.randrange(2, 9)})
            else:  # a child written without its counter, carrying a forged repair marker
                self.put({"PK": pk, "SK": f"LIKE#ROGUE#{n}", REPAIR_MARKER: f"forged-{n}"})
            self.faulted(pk, "count", "small")
        self.update(HOT, "META", "ADD likeTally :k", {":k": 7})
        self.faulted(HOT, "count", "hot")
        # Sum faults: a line without its total, a line deleted, a rogue total.
        self.put({"PK": ORDERS[0], "SK": "LINE#ROGUE", "amount": Decimal("4.20")})
        self.faulted(ORDERS[0], "sum", "small")
        self.stack.delete(ORDERS[1], "LINE#1")
        self.faulted(ORDERS[1], "sum", "small")
        self.set_total(ORDERS[2], "12345.67")
        self.faulted(ORDERS[2], "sum", "small")
        # A sequence fault: a number handed out and never written (a crashed client).
        self.update(SEQUENCE_FAULT, "COUNTER#ISSUE", "ADD lastIssue :one", {":one": 1})
        self.faulted(SEQUENCE_FAULT, "sequence", "small")

    # --- code "not ours": parents deleted and reused ------------------------------------

    def project(self, pk: str, issues: int) -> list[tuple[str, str]]:
        """A project with ``issues`` more numbers allocated; returns every key under it."""
        counter = {"PK": pk, "SK": "COUNTER#ISSUE"}
        for _ in range(issues):
            self.numbers.allocate(counter, strategy="gapless")
        return self.collection(pk)

    def collection(self, pk: str) -> list[tuple[str, str]]:
        """Every key under ``pk``, as a cleanup job would list them."""
        pages = self.stack.dynamodb.get_paginator("query").paginate(
            TableName=self.stack.table,
            KeyConditionExpression="PK = :pk",
            ExpressionAttributeValues={":pk": {"S": pk}},
            ConsistentRead=True,
        )
        return [(i["PK"]["S"], i["SK"]["S"]) for page in pages for i in page["Items"]]

    def gone(self, pk: str) -> None:
        with self.lock:
            self.ledger.gone.add(pk)

    def lifecycle_batch_delete_project(self) -> None:
        """A project's counter and its issues deleted in one BatchWriteItem."""
        pk = "PROJECT#gone-batch"
        keys = self.project(pk, 3)
        time.sleep(0.5)
        self.gone(pk)
        self.batch(deletes=keys)

    def lifecycle_transact_delete_project(self) -> None:
        """The same deletion in one TransactWriteItems."""
        pk = "PROJECT#gone-transact"
        keys = self.project(pk, 3)
        time.sleep(0.5)
        self.gone(pk)
        self.transact_delete(keys)

    def transact_delete(self, keys: list[tuple[str, str]]) -> None:
        self.stack.dynamodb.transact_write_items(
            TransactItems=[
                {"Delete": {"TableName": self.stack.table, "Key": serialize({"PK": p, "SK": s})}}
                for p, s in keys
            ]
        )

    def lifecycle_cascade_delete_post(self) -> None:
        """A post's META deleted, then a cleanup job deletes its likes a moment later."""
        pk = "POST#gone-cascade"
        keys = self.post(pk, 5)
        time.sleep(0.5)
        self.gone(pk)
        self.stack.delete(pk, "META")
        time.sleep(0.3)
        self.batch(deletes=keys[1:])

    def lifecycle_abandon_post(self) -> None:
        """A post's META deleted and its likes left for good: at most one alert, no write."""
        pk = "POST#gone-abandoned"
        self.post(pk, 3)
        time.sleep(0.5)
        with self.lock:
            self.ledger.either.add(pk)
        self.gone(pk)
        self.stack.delete(pk, "META")

    def lifecycle_reuse_post(self) -> None:
        """A post deleted with its likes in one transaction, its key used again: likeTally 0,
        two new likes."""
        pk = "POST#reused"
        keys = self.post(pk, 3)
        time.sleep(0.5)
        self.transact_delete(keys)
        self.put({"PK": pk, "SK": "META", "likeTally": 0, "tallyRevision": 0})
        for n in range(2):
            self.like({"PK": pk, "SK": f"LIKE#NEW#{n}"}, add=True)
        with self.lock:
            self.ledger.reused.add(pk)

    def lifecycle_delete_order(self) -> None:
        """An order deleted with its lines, in one transaction: a BatchWriteItem that removes
        the lines first can be verified with some lines gone and the order still there, a
        partial cascade no batch tells from a line deleted by hand (docs/verification.md)."""
        pk = "ORDER#gone"
        self.put({"PK": pk, "SK": "META", "total": 0, "tallyRevision": 0})
        for n in range(3):
            self.tallies.add_child({"PK": pk, "SK": f"LINE#{n}"}, {"amount": Decimal("1.25")})
        time.sleep(0.5)
        self.gone(pk)
        self.transact_delete(self.collection(pk))

    def lifecycle_delete_during_carry(self) -> None:
        """A hot post broken (its remainder carried), then deleted with its likes before the
        carry's recount: its alert is optional, a write under it is not allowed."""
        pk = "POST#gone-hot"
        keys = self.post(pk, HOT_CHILDREN)
        time.sleep(0.5)
        with self.lock:
            self.ledger.either.add(pk)
        self.update(pk, "META", "ADD likeTally :k", {":k": 3})
        time.sleep(1.0)
        self.gone(pk)
        self.batch(deletes=keys)

    def lifecycle_delete_during_recheck(self) -> None:
        """A project with a gap, deleted (everything under it) while its gap may be judged."""
        pk = "PROJECT#gone-gap"
        self.project(pk, 2)
        with self.lock:
            self.ledger.either.add(pk)
        self.update(pk, "COUNTER#ISSUE", "ADD lastIssue :one", {":one": 1})
        self.project(pk, 1)
        time.sleep(0.2)
        self.gone(pk)
        self.batch(deletes=self.collection(pk))

    def lifecycle_recreate_in_grace(self) -> None:
        """A project deleted with its issues and made again at once, numbering from 1."""
        pk = "PROJECT#again"
        keys = self.project(pk, 3)
        time.sleep(0.5)
        self.batch(deletes=keys)
        self.project(pk, 2)
        with self.lock:
            self.ledger.reused.add(pk)

    def lifecycle_ttl_parent(self) -> None:
        """A post's META removed by TTL, its likes by TTL a moment later."""
        pk = "POST#gone-ttl"
        keys = self.post(pk, 3)
        self.ttl.expire(keys)
        time.sleep(0.5)
        self.gone(pk)
        self.stack.delete(pk, "META")
        time.sleep(0.3)
        self.batch(deletes=keys[1:])

    # --- judging ------------------------------------------------------------------------

    def judge(self, alerts: list[Alert]) -> Outcome:
        ledger, stack = self.ledger, self.stack
        outcome = Outcome(self.factor, alerts=[a.body for a in alerts])
        alerted = {a.pk for a in alerts}
        outcome.false_negatives = ledger.broken - alerted
        outcome.false_positives = alerted - ledger.broken - ledger.either
        for fault in ledger.faults:
            first = min((a.at for a in alerts if a.pk == fault.pk), default=None)
            if first is not None:
                outcome.latencies.setdefault(f"{fault.kind}/{fault.size}", []).append(
                    max(0.0, first - fault.at)
                )
        # Lost writes: acknowledged children, and counters of the parents that live.
        lost = outcome.lost_writes
        for name, present in ledger.likes.items():
            if present != bool(stack.item(*name.split("/"))):
                lost.append(name)
        lost += [sk for sk in ledger.lines if stack.item(LIVE_ORDER, sk) is None]
        items = self.scan()
        for pk in [*POSTS, HOT, *(p for p in ledger.reused if p.startswith("POST#"))]:
            likes = [i for (p, s), i in items.items() if p == pk and s.startswith("LIKE#")]
            meta = items.get((pk, "META"))
            if meta is None or meta["likeTally"] != len(likes):
                lost.append(f"{pk} counter")
        for pk in (PROJECT, *(p for p in ledger.reused if p.startswith("PROJECT#"))):
            issues = [i for (p, s), i in items.items() if p == pk and s.startswith("ISSUE#")]
            counter = items.get((pk, "COUNTER#ISSUE"))
            expected = ledger.numbers if pk == PROJECT else 2
            if counter is None or counter["lastIssue"] != expected or len(issues) != expected:
                lost.append(f"{pk} numbers")
            if any("void" in i for i in issues):
                lost.append(f"{pk} voided")
        outcome.harmful_writes = harmful_writes(items, ledger.gone)
        return outcome

    def scan(self) -> dict[tuple[str, str], dict[str, Any]]:
        pages = self.stack.dynamodb.get_paginator("scan").paginate(
            TableName=self.stack.table, ConsistentRead=True
        )
        items = (deserialize(i) for page in pages for i in page["Items"])
        return {(i["PK"], i["SK"]): i for i in items}


def watched_schedule() -> RecheckSchedule:
    """The rechecks the in-process handlers schedule (they share runtime's clients)."""
    schedule = RecheckSchedule()
    schedule.watch(runtime._clients()[2])
    return schedule


def harmful_writes(items: dict[tuple[str, str], dict[str, Any]], gone: set[str]) -> list[str]:
    """Items the reconciler wrote (its marker, or a VOID) under a parent that is not there or
    that the application deleted; the harness's own forged markers are the application's."""
    harmful = []
    for (pk, sk), item in sorted(items.items()):
        marker = str(item.get(REPAIR_MARKER, ""))
        if not (item.get("void") or (marker and not marker.startswith("forged-"))):
            continue
        head = next((h for h in PARENT_SK if pk.startswith(h)), None)
        if head is None:
            continue
        parent = (pk, PARENT_SK[head])
        if pk in gone or parent not in items:
            what = "VOID" if item.get("void") else f"marker {marker}"
            harmful.append(f"{pk}/{sk} ({what})")
    return harmful


def write_report(outcome: Any, name: str, default: Path) -> None:
    """Print a run's outcome and add it, as JSON under ``name``, to $TALLY_LIVE_REPORT (else
    to ``default``)."""
    print(f"\n{name}: {outcome.describe()}")
    target = Path(os.environ.get("TALLY_LIVE_REPORT") or default)
    runs = json.loads(target.read_text()) if target.exists() else {}
    runs[name] = outcome.as_json()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(runs, indent=2, sort_keys=True))


@contextlib.contextmanager
def live_stack(
    dynamodb_endpoint: str,
    moto_endpoint: str,
    rules_file: Path,
    *,
    prefix: str = "tally-live",
    create_main: Callable[[Any, str], None] | None = None,
) -> Iterator[Any]:
    """A fresh test stack (tables, topic, queues, the handlers' environment) outside pytest,
    as the integration tests' ``stack`` fixture makes it: for benchmarks/live_faults.py, and
    with ``create_main`` making its main table, for the index scenario (live_index.py)."""
    from tally.core.streams import StreamReader, stream_arn
    from tally.local.dynamodb_local import local_client_kwargs
    from tally.local.template import create_table
    from tests.integration.conftest import Stack, alerting, stack_environment
    from tests.integration.conftest import _clear_caches as clear

    template = load_template(template_path())
    dynamodb = boto3.client("dynamodb", **local_client_kwargs(dynamodb_endpoint))
    suffix = uuid.uuid4().hex[:10]
    table, audit_table = f"{prefix}-{suffix}", f"{prefix}-audit-{suffix}"
    if create_main is None:
        create_table(dynamodb, template, "Table", table)
    else:
        create_main(dynamodb, table)
    create_table(dynamodb, template, "AuditTable", audit_table)
    sqs, topic_arn, alert_queue, recheck_queue = alerting(moto_endpoint, suffix)
    variables = stack_environment(
        table, audit_table, topic_arn, recheck_queue, rules_file, dynamodb_endpoint, moto_endpoint
    )
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    clear()
    try:
        streams = boto3.client("dynamodbstreams", **local_client_kwargs(dynamodb_endpoint))
        reader = StreamReader(streams, stream_arn(dynamodb, table))
        yield Stack(
            dynamodb, sqs, table, audit_table, topic_arn, alert_queue, recheck_queue, reader
        )
    finally:
        clear()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name in (table, audit_table):
            dynamodb.delete_table(TableName=name)
