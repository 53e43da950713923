"""The live scenario for children found through an index: followers (a follow edge in the
follower's item collection, counted under the followee through an inverted GSI) and product
totals across every cart (kept by the shopping-cart sample's stream aggregator).

The application writes from a process of its own (tests/harness/index_application.py):
follows, unfollows, edges re-pointed to another followee, FOLLOWING# -> BLOCKED# and back,
each through TallyWriter (transactional with its counters); cart lines put, changed and
deleted plainly. The
aggregator (``CartAggregator``) adds each stream batch's quantity deltas per product, late
(0.1-1 s after the tap saw the batch). The pump verifies while the index lags
(tests/harness/index_lag.py: a Query through an index by the reconciler reads the table as
it was 1.5 s +- 0.3 s earlier). An injector breaks followee counts (a rogue SET or ADD on
the counter, an edge written without its counter, an edge deleted without its decrement)
and product totals (a rogue SET; a stream batch the aggregator adds twice, as a
redelivery does), each on a parent of its own; then, on followees the application never
writes (``QUIET``), the faults a lagging index can hide: an edge put, deleted, blocked or
re-pointed without its counts, and a legitimate follow followed a second later by a rogue
+3 (a recount through the index alone would set that counter short).

    with index_stack(dynamodb_endpoint, moto_endpoint) as stack:
        outcome = LiveIndexRun(stack, seed=1).run()
    outcome.counts()  # false negatives, false positives, lost writes, harmful writes

What is counted:
- false negative: a parent the injector broke that was never alerted;
- false positive: an alert on any key the injector did not break;
- lost write: an acknowledged edge or cart line not as acknowledged at the end; a followee
  whose counter is not its FOLLOWING edges' count at the end (the rule repairs, so broken
  ones too); an unbroken product whose total is not its lines' sum at the end;
- harmful write: a write of the reconciler's (seen on its client) to the table on any item
  but a broken followee's profile (product totals are alert-only: never); a repair of a
  quiet followee to anything but its edges' count (they hold still after its fault).

Latency: from the fault write's acknowledgement to the first alert on its parent arriving
in the subscriber's queue. Read units: every read of the reconciler's client on the table
and its indexes (its own ``ReturnConsumedCapacity``), per rule, against a naive recount:
one eventually consistent Query of the touched followee(s) (product) per edge (line) write,
each costed by running that Query on the final table with ``ReturnConsumedCapacity``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import statistics
import threading
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3

from tally.core.streams import StreamReader, stream_arn
from tally.handlers import recheck as recheck_handler
from tally.handlers import reconciler as reconciler_handler
from tally.local.dynamodb_local import local_client_kwargs
from tally.local.pump import Pump
from tally.local.stream_trigger import MappingSettings
from tally.local.template import create_table_from, load_template, template_path
from tally.reconciler import runtime
from tally.reconciler.store.items import key_json, parent_pk
from tally.reconciler.store.parts import Store
from tally.reconciler.store.recent import PREFIX as RECENT_PREFIX
from tally.rules import load_rules
from tally.writers import TallyWriter
from tests.harness.index_application import (
    BLOCKED,
    FOLLOWEES,
    FOLLOWING,
    PRODUCTS,
    PROFILE,
    TOTAL,
    Acknowledged,
    IndexApplication,
)
from tests.harness.index_lag import LaggingIndex, StreamTap
from tests.harness.index_tables import followers_and_totals_table
from tests.harness.live import (
    Alert,
    Counted,
    Subscriber,
    live_stack,
    watched_schedule,
)
from tests.utils import TTL_IDENTITY, deserialize, lambda_context, serialize

RULES_FILE = Path(__file__).resolve().parents[1] / "integration" / "live_index_rules.toml"
# Followees the application never writes: each is broken once, quietly, so that its looks
# come a grace after the fault and the index's lag alone decides what a recount through it
# sees (the faults the index can hide: a child changed without its counter; a legitimate
# follow the index does not show yet, then a rogue bump).
BROKEN_QUIETLY = [f"USER#q{n:02d}" for n in range(10)]
# Where the fifth and tenth of them lose their seed edge to, moved without its counts: a
# followee of its own, broken by that move alone (its edges then hold still too).
MOVED_TO = {n: f"USER#m{n:02d}" for n in (4, 9)}
QUIET = BROKEN_QUIETLY + list(MOVED_TO.values())
# A followee written several times a second for the whole run (a popular account), by a
# writer of the harness's own (TallyWriter: stamped), and broken twice while it is: a
# rogue ADD, then an edge put without its count. Each must be alerted while its writes go
# on, and repaired by its offset (HOT_OFFSETS, before - after; one repair may mend both).
HOT = "USER#h00"
HOT_PAUSE = 0.25
# Each hot write waits, after its pause, until the window notes the one before it, at most
# this long: a look proves a moving parent only when the stream has brought every change of it
# but the newest (docs/verification.md, "Parents that never rest", Limits). Lambda reads each
# shard in a process of its own; the local pump shares this one with every writer thread of
# the harness, and on a busy machine falls behind a writer that never waits for it.
HOT_NOTED_SECONDS = 20.0
HOT_FAULTS_AFTER = (12, 40)  # the hot writer's writes before each fault
HOT_OFFSETS = [5, -1]
# How long the hot followee's writes go on after the application's, at most, waiting for its
# faults' alerts (a busy machine's single recheck lane may take a while to come to them).
HOT_SECONDS = 180.0
GSI1, BY_PRODUCT = "GSI1", "ByProduct"
# How long the live pump goes on after the writes, waiting for every fault's alert.
ALERT_SECONDS = 30.0
READS = ("GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems")
WRITES = ("PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem")


def index_table_kwargs(name: str) -> dict[str, Any]:
    """The scenario's table: pk/sk, the followers' inverted GSI1 (keys only) and the carts'
    inverted ByProduct (sk HASH, pk RANGE, projecting quantity), a stream of both images."""
    return followers_and_totals_table(name, keys=("pk", "sk"), inverted=BY_PRODUCT)


@dataclass
class Fault:
    pk: str
    kind: str  # e.g. "count/rogue-set", "sum/redelivered"
    at: float


@dataclass
class ReadUnits:
    """Read units, per rule ("followers", "products") and operation."""

    units: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, rule: str, operation: str, units: float) -> None:
        per = self.units.setdefault(rule, {})
        per[operation] = per.get(operation, 0.0) + units

    def total(self, rule: str) -> float:
        return sum(self.units.get(rule, {}).values())


@dataclass
class Outcome(Counted):
    """What one run counted."""

    seed: int
    false_negatives: set[str] = field(default_factory=set)
    false_positives: set[str] = field(default_factory=set)
    lost_writes: list[str] = field(default_factory=list)
    harmful_writes: list[str] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    # Per rule: edge (line) writes, the reconciler's read units, a naive recount's.
    cost: dict[str, dict[str, Any]] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)  # what the lagging index did
    seconds: float = 0.0

    def alert_pk(self, alert: dict[str, Any]) -> str:
        return alert_pk(alert)

    def as_json(self) -> dict[str, Any]:
        return {"seed": self.seed, **self.counted_json(), "cost": self.cost, "index": self.index}

    def describe(self) -> str:
        lines = self.counted_lines(f"seed {self.seed}")
        lines += [f"  {line}" for line in cost_lines(self.cost)]
        return "\n".join(lines)


def cost_lines(cost: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for rule, row in sorted(cost.items()):
        writes = row["writes"] or 1
        lines.append(
            f"{rule}: {row['writes']} writes; reconciler {row['reconciler']:.1f} RU "
            f"({1000 * row['reconciler'] / writes:.0f} per 1,000) and "
            f"{row['reconciler_write_units']:.1f} WU "
            f"({1000 * row['reconciler_write_units'] / writes:.0f} per 1,000), naive recount "
            f"{row['naive']:.1f} RU ({1000 * row['naive'] / writes:.0f} per 1,000); "
            f"by operation {row['operations']} {row['write_operations']}"
        )
    return lines


def hot_repairs_harmful(repairs: list[Any], offsets: list[int]) -> bool:
    """The hot followee's applied repairs (each by how much it moved the counter), in the
    order they were made, against its faults' offsets: one repair may mend several faults
    at once, but each must mend every fault up to a later one than the repair before (its
    running total is the faults' running total at a later fault each time)."""
    faults = list(itertools.accumulate(offsets))
    places = [faults.index(m) if m in faults else -1 for m in itertools.accumulate(repairs)]
    return -1 in places or any(later <= earlier for earlier, later in itertools.pairwise(places))


def seed_edge_key(followee: str) -> dict[str, Any]:
    """The key of the edge that follows ``followee`` from the set-up (``LiveIndexRun.setup``)."""
    return serialize({"pk": f"USER#seed-{followee[5:]}", "sk": "FOLLOWS#0"})


def alert_pk(body: dict[str, Any]) -> str:
    key = body.get("key") or {}
    return str(key.get("pk", key))


class CartAggregator:
    """The shopping-cart sample's stream aggregator (``db_stream_handler``): per batch, the
    quantity deltas of the cart lines summed per product and ADDed to the product's total,
    with no idempotency. It runs ``late`` seconds after the tap saw its batch, batches in
    order; ``redeliver(n)`` makes it add the next ``n`` suitable batches twice (a batch
    whose products all have a delta and none was broken before), each duplicate ADD a fault
    on every product it touched."""

    def __init__(self, dynamodb: Any, table: str, seed: int, late: tuple[float, float]):
        self.dynamodb, self.table = dynamodb, table
        self.rng = random.Random(seed)
        self.late = late
        self.pending: list[tuple[float, dict[str, int]]] = []
        self.redeliveries = 0
        self.faults: list[Fault] = []
        self.broken: set[str] = set()  # products whose total was broken on purpose
        self.batches = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None

    def observe(self, records: list[dict[str, Any]], seen: float) -> None:
        deltas: defaultdict[str, int] = defaultdict(int)
        for record in records:
            stream = record["dynamodb"]
            keys = deserialize(stream["Keys"])
            if not (str(keys["pk"]).startswith("cart#") and str(keys["sk"]).startswith("product#")):
                continue
            deltas[keys["sk"]] += self._quantity(stream.get("NewImage"))
            deltas[keys["sk"]] -= self._quantity(stream.get("OldImage"))
        deltas = defaultdict(int, {k: v for k, v in deltas.items() if v})
        if deltas:
            with self._lock:
                previous = self.pending[-1][0] if self.pending else 0.0
                due = max(seen + self.rng.uniform(*self.late), previous)
                self.pending.append((due, dict(deltas)))
                self._idle.clear()

    @staticmethod
    def _quantity(image: dict[str, Any] | None) -> int:
        if not image or "quantity" not in image:
            return 0
        return int(deserialize({"q": image["quantity"]})["q"])

    def redeliver(self, batches: int) -> None:
        with self._lock:
            self.redeliveries += batches

    def step(self, now: float) -> None:
        while True:
            with self._lock:
                if not self.pending or self.pending[0][0] > now:
                    if not self.pending:
                        self._idle.set()
                    return
                _, deltas = self.pending.pop(0)
                again = self.redeliveries > 0 and not (set(deltas) & self.broken)
                if again:
                    self.redeliveries -= 1
                    self.broken |= set(deltas)
            self.add(deltas)
            self.batches += 1
            if again:
                self.add(deltas)
                at = time.time()
                self.faults += [Fault(p, "sum/redelivered", at) for p in deltas]

    def add(self, deltas: dict[str, int]) -> None:
        for product, delta in sorted(deltas.items()):
            self.dynamodb.update_item(
                TableName=self.table,
                Key=serialize({"pk": product, "sk": TOTAL}),
                UpdateExpression="ADD quantity :d",
                ExpressionAttributeValues={":d": {"N": str(delta)}},
            )

    def start(self) -> CartAggregator:
        def run() -> None:
            while not self._stop.wait(0.05):
                self.step(time.time())

        self._thread = threading.Thread(target=run, name="cart-aggregator", daemon=True)
        self._thread.start()
        return self

    def wait_idle(self, seconds: float = 30) -> bool:
        return self._idle.wait(seconds)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class ReconcilerCalls:
    """The reconciler's own client, watched: request units per rule (reads of the table, its
    indexes and the audit table; the audit table's writes: the stream's window of index
    children, carries), writes to the table."""

    def __init__(self, client: Any, table: str, shadow: str, audit: str):
        self.client, self.tables = client, {table, shadow}
        self.table, self.audit = table, audit
        self.reads = ReadUnits()
        self.audit_writes = ReadUnits()  # write units, by rule and operation
        self.writes: list[tuple[float, str, str, str]] = []  # (time, operation, pk, sk)
        self._lock = threading.Lock()
        client.meta.events.register("before-parameter-build.dynamodb", self._before)
        client.meta.events.register("after-call.dynamodb", self._after)

    def uninstall(self) -> None:
        self.client.meta.events.unregister("before-parameter-build.dynamodb", self._before)
        self.client.meta.events.unregister("after-call.dynamodb", self._after)

    def _before(
        self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        context["idxlive"] = (model.name, json.loads(json.dumps(params, default=str)))

    def _after(
        self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        operation, params = context.get("idxlive", (None, None))
        if operation is None or http_response.status_code >= 300:
            return
        with self._lock:
            consumed = parsed.get("ConsumedCapacity") or []
            for entry in consumed if isinstance(consumed, list) else [consumed]:
                rule, units = rule_of(operation, params), entry["CapacityUnits"]
                if operation in READS and entry.get("TableName") in self.tables | {self.audit}:
                    self.reads.add(rule, operation, units)
                elif operation in WRITES and entry.get("TableName") == self.audit:
                    self.audit_writes.add(rule, operation, units)
            if operation in WRITES:
                at = time.time()
                self.writes += [
                    (at, operation, pk, sk)
                    for pk, sk in written_keys(operation, params, self.table)
                ]


def rule_of(operation: str, params: dict[str, Any]) -> str:
    """Which rule a read of the reconciler's was for, by the index or the keys it names."""
    index = params.get("IndexName")
    if index:
        return "followers" if index == GSI1 else "products"
    text = json.dumps(params)
    return "followers" if "USER#" in text else "products"


def written_keys(operation: str, params: dict[str, Any], table: str) -> list[tuple[str, str]]:
    found = []
    if operation == "TransactWriteItems":
        for item in params["TransactItems"]:
            for verb in ("Put", "Update", "Delete"):
                action = item.get(verb)
                if action and action["TableName"] == table:
                    key = action.get("Key") or action["Item"]
                    found.append((key["pk"]["S"], key["sk"]["S"]))
    elif operation == "BatchWriteItem":
        for request in params["RequestItems"].get(table, []):
            body = request.get("PutRequest", {}).get("Item") or request["DeleteRequest"]["Key"]
            found.append((body["pk"]["S"], body["sk"]["S"]))
    elif params.get("TableName") == table:
        key = params.get("Key") or params["Item"]
        found.append((key["pk"]["S"], key["sk"]["S"]))
    return found


class LiveIndexRun:
    """One run of the scenario on a fresh ``stack`` (``index_stack``)."""

    def __init__(
        self,
        stack: Any,
        *,
        seed: int = 1,
        followers: int = 4,
        carts: int = 2,
        operations: int = 50,
        pause: float = 0.12,
        lag: float = 1.5,
        jitter: float = 0.3,
        split_shards: bool = False,
    ):
        self.stack, self.seed = stack, seed
        self.split_shards = split_shards
        self.options = {
            "seed": seed,
            "followers": followers,
            "carts": carts,
            "operations": operations,
            "pause": pause,
        }
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        # The hot followee's writer: its acknowledged edges ("pk/sk" -> followee or gone),
        # its writes, and when it stopped writing.
        self.hot_edges: dict[str, str | None] = {}
        self.hot_writes = 0
        self.hot_stopped = float("inf")
        self.hot_waited = 0.0  # how long the hot writes waited for the window, in all
        self.written = threading.Event()
        self.phases: dict[str, float] = {}  # when each phase of the run ended
        self.invocations: dict[str, list[tuple[float, float, int]]] = {}
        dynamodb = stack.dynamodb
        # The parents' own items (profiles, product totals) sit in no partition of an index
        # that any Query reads (no GSI1PK; ByProduct partitions PROFILE and totalquantity):
        # the shadow leaves them out.
        self.index = LaggingIndex(
            dynamodb,
            stack.table,
            lag=lag,
            jitter=jitter,
            seed=seed,
            keep=lambda keys: keys["sk"]["S"] not in (PROFILE, TOTAL),
        )
        self.aggregator = CartAggregator(dynamodb, stack.table, seed, late=(0.1, 1.0))
        streams = boto3.client("dynamodbstreams", **local_client_kwargs(dynamodb.meta.endpoint_url))
        self.tap = StreamTap(
            StreamReader(streams, stream_arn(dynamodb, stack.table)), [self.index.observe]
        )
        client = runtime._clients()[0]
        self.index.install(client)
        self.calls = ReconcilerCalls(client, stack.table, self.index.shadow, stack.audit_table)
        settings = MappingSettings.from_template(load_template(template_path()), parallelization=1)
        failures = stack.sqs.create_queue(QueueName=f"failures-{uuid.uuid4().hex[:8]}")
        self.expired: set[tuple[str, str]] = set()  # cart lines TTL removes during the run
        self.pump = Pump(
            stack.reader,
            self.verify,
            lambda event: self.timed("recheck", recheck_handler.handler, event),
            stack.sqs,
            stack.recheck_queue,
            failures["QueueUrl"],
            settings,
            schedule=watched_schedule(),
            rechecks_beside=True,
            # Lambda polls a standard queue with five concurrent batches while messages wait.
            recheck_lanes=5,
        )

    # --- the run ------------------------------------------------------------------------

    def run(self) -> Outcome:
        started = time.monotonic()
        try:
            return self._run(started)
        finally:
            self.aggregator.stop()
            self.tap.stop()
            self.index.close()
            self.calls.uninstall()

    def _run(self, started: float) -> Outcome:
        self.setup()
        self.tap.drain()
        self.index.catch_up()
        self.pump.until_idle(max_seconds=60)
        self.tap.observers.append(self.aggregator.observe)
        self.calls.reads, self.calls.audit_writes = ReadUnits(), ReadUnits()
        self.phases["set up"] = time.time()
        application = IndexApplication.start(
            self.stack.dynamodb.meta.endpoint_url,
            self.stack.table,
            str(RULES_FILE),
            **self.options,
        )
        subscriber = Subscriber(self.stack.sqs, self.stack.alert_queue)
        subscriber.start()
        self.tap.start()
        self.index.start()
        self.aggregator.start()
        pumping = threading.Thread(target=self.pump.forever, name="pump")
        pumping.start()
        hot = threading.Thread(target=self.write_hot, args=(subscriber,), name="hot")
        try:
            application.go()
            hot.start()
            injector = threading.Thread(target=self.break_parents, name="injector")
            injector.start()
            acknowledged = application.result()
            self.phases["written"] = time.time()
            self.written.set()
            injector.join()
            hot.join()
            # The aggregator adds what is still pending (the tap feeds it until the end).
            time.sleep(0.5)
            self.aggregator.wait_idle()
            # The live pump goes on until every fault is alerted, for at most ALERT_SECONDS.
            deadline = time.monotonic() + ALERT_SECONDS
            while time.monotonic() < deadline and not self.all_alerted(subscriber):
                time.sleep(0.2)
        finally:
            self.written.set()
            if hot.is_alive():
                hot.join()
            application.stop()
            self.pump.stop(1)
            pumping.join()
        self.phases["pump stopped"] = time.time()
        self.pump.stop_signal = None
        report = self.pump.until_idle(max_seconds=120, rechecks=True)
        self.phases["idle"] = time.time()
        alerts = subscriber.stop()
        outcome = self.judge(alerts, acknowledged)
        if not report.idle:
            outcome.lost_writes.append("the pump never went idle")
        if self.tap.errors:
            outcome.lost_writes.append(f"the stream tap failed: {self.tap.errors[0]!r}")
        outcome.index = {
            "lag": self.index.schedule.lag,
            "jitter": self.index.schedule.jitter,
            "changes_applied": self.index.applied,
            "max_applied_late": round(self.index.max_late, 3),
            "changes_applied_late": self.index.late,
            "max_late_at": round(self.index.max_late_at - self.phases["set up"], 2),
            "max_write_seconds": round(self.index.max_write_seconds, 2),
            "max_round_gap": round(self.index.max_gap, 2),
            "queries_redirected": self.index.redirected,
            "hot_writes": self.hot_writes,
            "hot_waited_for_window": round(self.hot_waited, 2),
            "aggregator_batches": self.aggregator.batches,
            "phases": {k: round(v - self.phases["set up"], 2) for k, v in self.phases.items()},
            "invocations": {
                name: {
                    "count": len(calls),
                    "records": sum(c[2] for c in calls),
                    "seconds": round(sum(c[1] for c in calls), 1),
                    "max_seconds": round(max(c[1] for c in calls), 2),
                }
                for name, calls in self.invocations.items()
            },
            "alerts_at": [round(a.at - self.phases["set up"], 2) for a in alerts],
            "faults_at": [
                round(f.at - self.phases["set up"], 2) for f in self.faults + self.aggregator.faults
            ],
        }
        outcome.seconds = time.monotonic() - started
        return outcome

    def verify(self, event: dict[str, Any]) -> Any:
        """The stream handler, as the pump invokes it. With ``split_shards``, each batch is
        delivered as two, by a hash of the partition key (each key's records stay in order):
        as DynamoDB spreads item collections over shards, a writer's transaction then reaches
        the reconciler as two unbalanced halves (DynamoDB Local keeps one shard)."""
        event = self.mark_ttl(event)
        if not self.split_shards:
            return self.timed("stream", reconciler_handler.handler, event)
        halves: list[list[dict[str, Any]]] = [[], []]
        for record in event["Records"]:
            pk = str(deserialize(record["dynamodb"]["Keys"])["pk"])
            halves[zlib.crc32(pk.encode()) % 2].append(record)
        failures: list[dict[str, str]] = []
        for records in halves:
            if records:
                answer = self.timed("stream", reconciler_handler.handler, {"Records": records})
                failures += answer.get("batchItemFailures", [])
        return {"batchItemFailures": failures}

    def timed(self, name: str, handler: Any, event: dict[str, Any]) -> Any:
        """Invoke a handler as the pump does, keeping (start, seconds, records) per kind."""
        began = time.time()
        try:
            return handler(event, lambda_context())
        finally:
            with self.lock:
                self.invocations.setdefault(name, []).append(
                    (began, time.time() - began, len(event["Records"]))
                )

    def mark_ttl(self, event: dict[str, Any]) -> dict[str, Any]:
        """A removal of an expired cart line is TTL's, as DynamoDB marks it (DynamoDB Local
        neither expires items nor marks records: the injector deletes them, this marks)."""
        for record in event["Records"]:
            keys = deserialize(record["dynamodb"]["Keys"])
            if record["eventName"] == "REMOVE" and (keys["pk"], keys["sk"]) in self.expired:
                record["userIdentity"] = dict(TTL_IDENTITY)
        return event

    def all_alerted(self, subscriber: Subscriber) -> bool:
        alerted = {alert_pk(a.body) for a in list(subscriber.alerts)}
        with self.lock:
            faults = self.faults + self.aggregator.faults
        return {f.pk for f in faults} <= alerted

    # --- set-up -----------------------------------------------------------------------

    def setup(self) -> None:
        """Every followee followed once by a seed follower of its own (the injector deletes
        some of those edges); every product in three seed carts, the third one expired (TTL
        removes its lines during the run: the aggregator subtracts them, no fault); counters
        in step."""
        puts: list[dict[str, Any]] = []
        for followee in [*FOLLOWEES, *QUIET, HOT]:
            puts.append({"pk": followee, "sk": PROFILE, "followerCount": 1, "rev": 0})
            puts.append(
                {
                    "pk": f"USER#seed-{followee[5:]}",
                    "sk": "FOLLOWS#0",
                    "GSI1PK": followee,
                    "GSI1SK": f"{FOLLOWING}seed",
                }
            )
        for n, product in enumerate(PRODUCTS):
            quantities = [1 + n % 3, 2, 1]
            puts.append({"pk": product, "sk": TOTAL, "quantity": sum(quantities)})
            puts += [
                {"pk": f"cart#seed-{c}", "sk": product, "quantity": q}
                for c, q in enumerate(quantities[:2])
            ]
            puts.append(
                {
                    "pk": "cart#seed-expired",
                    "sk": product,
                    "quantity": quantities[2],
                    "expirationTime": int(time.time()) - 60,
                }
            )
            self.expired.add(("cart#seed-expired", product))
        self.batch(puts)

    def batch(self, items: list[dict[str, Any]]) -> None:
        for start in range(0, len(items), 25):
            pending = {
                self.stack.table: [
                    {"PutRequest": {"Item": serialize(i)}} for i in items[start : start + 25]
                ]
            }
            while pending:
                answer = self.stack.dynamodb.batch_write_item(RequestItems=pending)
                pending = answer.get("UnprocessedItems") or {}

    # --- the hot followee --------------------------------------------------------------

    def write_hot(self, subscriber: Subscriber) -> None:
        """Follows and unfollows of ``HOT``, one each ``HOT_PAUSE``, from the application's
        start until it is done and both faults are alerted (or ``HOT_SECONDS`` after: a
        fault alerted only after that was not alerted while the writes went on)."""
        rng = random.Random(self.seed * 7 + 1)
        db, table = self.stack.dynamodb, self.stack.table
        writer = TallyWriter(db, table, load_rules(RULES_FILE))
        following: list[dict[str, str]] = []
        deadline = float("inf")
        last: tuple[dict[str, str], bool] | None = None
        while True:
            if last is not None:
                self.await_noted(*last)
            if self.written.is_set() and deadline == float("inf"):
                deadline = time.monotonic() + HOT_SECONDS
            if self.written.is_set() and (
                self.hot_alerted(subscriber) or time.monotonic() > deadline
            ):
                break
            if following and rng.random() < 0.3:
                key = following.pop(rng.randrange(len(following)))
                assert writer.remove_child(key).outcome == "removed"
                self.hot_edges[f"{key['pk']}/{key['sk']}"] = None
                last = (key, False)
            else:
                key = {"pk": f"USER#hf{self.hot_writes:04d}", "sk": "FOLLOWS#0"}
                status = {"GSI1PK": HOT, "GSI1SK": f"{FOLLOWING}hot"}
                assert writer.add_child(key, status).outcome == "created"
                following.append(key)
                self.hot_edges[f"{key['pk']}/{key['sk']}"] = HOT
                last = (key, True)
            self.hot_writes += 1
            if self.hot_writes == HOT_FAULTS_AFTER[0]:
                db.update_item(
                    TableName=table,
                    Key=serialize({"pk": HOT, "sk": PROFILE}),
                    UpdateExpression="ADD followerCount :k",
                    ExpressionAttributeValues=serialize({":k": HOT_OFFSETS[0]}),
                )
                self.faulted(HOT, "hot/rogue-add")
            if self.hot_writes == HOT_FAULTS_AFTER[1]:
                edge = {"pk": "USER#rogue-hot", "sk": "FOLLOWS#0", "GSI1PK": HOT}
                db.put_item(TableName=table, Item=serialize(edge | {"GSI1SK": f"{FOLLOWING}r"}))
                self.faulted(HOT, "hot/edge-without-counter")
            time.sleep(HOT_PAUSE)
        self.hot_stopped = time.time()

    def await_noted(self, child: dict[str, str], counted: bool) -> None:
        """Wait until the stream's window notes ``child`` under ``HOT`` as ``counted`` (one
        consistent GetItem of its note in the audit table, every 50 ms), at most
        ``HOT_NOTED_SECONDS``: how a writer paced by the reconciler's iterator age writes."""
        started = time.monotonic()
        key = {
            "PK": parent_pk("followers", {"pk": HOT, "sk": PROFILE}),
            "SK": f"{RECENT_PREFIX}{key_json(child)}",
        }
        while time.monotonic() - started < HOT_NOTED_SECONDS:
            note = self.stack.dynamodb.get_item(
                TableName=self.stack.audit_table, Key=serialize(key), ConsistentRead=True
            ).get("Item")
            if note is not None and deserialize(note).get("counted") is counted:
                break
            time.sleep(0.05)
        self.hot_waited += time.monotonic() - started

    def hot_alerted(self, subscriber: Subscriber) -> bool:
        """Has every fault on ``HOT`` been alerted after it?"""
        with self.lock:
            faults = [f for f in self.faults if f.pk == HOT]
        alerts = [a.at for a in list(subscriber.alerts) if alert_pk(a.body) == HOT]
        return len(faults) == len(HOT_OFFSETS) and all(
            any(at >= f.at for at in alerts) for f in faults
        )

    # --- the injector -----------------------------------------------------------------

    def faulted(self, pk: str, kind: str) -> None:
        with self.lock:
            self.faults.append(Fault(pk, kind, time.time()))

    def break_parents(self) -> None:
        """Rogue writes, each on a parent of its own, while the application writes."""
        rng = random.Random(self.seed)
        db, table = self.stack.dynamodb, self.stack.table
        victims = rng.sample(FOLLOWEES, 8)
        products = rng.sample(PRODUCTS, 3)
        time.sleep(rng.uniform(0.3, 0.8))
        self.aggregator.redeliver(1)
        for n, followee in enumerate(victims):
            time.sleep(rng.uniform(0.2, 0.7))
            profile = serialize({"pk": followee, "sk": PROFILE})
            if n % 4 == 0:  # a rogue overwrite to a value no truth can have
                db.update_item(
                    TableName=table,
                    Key=profile,
                    UpdateExpression="SET followerCount = :v",
                    ExpressionAttributeValues=serialize({":v": 1000 + n}),
                )
                self.faulted(followee, "count/rogue-set")
            elif n % 4 == 1:  # a rogue bump (no revision)
                db.update_item(
                    TableName=table,
                    Key=profile,
                    UpdateExpression="ADD followerCount :k",
                    ExpressionAttributeValues=serialize({":k": rng.randrange(2, 9)}),
                )
                self.faulted(followee, "count/rogue-add")
            elif n % 4 == 2:  # an edge written without its counter
                edge = {
                    "pk": f"USER#rogue-{n}",
                    "sk": "FOLLOWS#0",
                    "GSI1PK": followee,
                    "GSI1SK": f"{FOLLOWING}rogue",
                }
                db.put_item(TableName=table, Item=serialize(edge))
                self.faulted(followee, "count/edge-without-counter")
            else:  # an edge deleted without its decrement
                db.delete_item(TableName=table, Key=seed_edge_key(followee))
                self.faulted(followee, "count/delete-without-decrement")
            if n == 2:  # TTL's sweep of the expired cart
                for pk, sk in sorted(self.expired):
                    db.delete_item(TableName=table, Key=serialize({"pk": pk, "sk": sk}))
            if n == 3:
                self.aggregator.redeliver(1)
            if n == 5:  # a rogue product total
                product = next(p for p in products + PRODUCTS if p not in self.aggregator.broken)
                with self.aggregator._lock:
                    self.aggregator.broken.add(product)
                db.update_item(
                    TableName=table,
                    Key=serialize({"pk": product, "sk": TOTAL}),
                    UpdateExpression="SET quantity = :v",
                    ExpressionAttributeValues=serialize({":v": 9999}),
                )
                self.faulted(product, "sum/rogue-set")
        self.break_quiet_parents(rng)

    def break_quiet_parents(self, rng: random.Random) -> None:
        """Each quiet followee broken once, behind its counter's back: an edge put, deleted,
        blocked or re-pointed to a quiet followee of its own without its counts; or a
        legitimate follow (through TallyWriter) and a rogue +3 a second later."""
        db, table = self.stack.dynamodb, self.stack.table
        writer = TallyWriter(db, table, load_rules(RULES_FILE))
        for n, quiet in enumerate(BROKEN_QUIETLY):
            time.sleep(rng.uniform(0.1, 0.3))
            seed_edge = seed_edge_key(quiet)
            kind = n % 5
            if kind == 0:
                edge = {"pk": f"USER#rogue-{quiet[5:]}", "sk": "FOLLOWS#0", "GSI1PK": quiet}
                db.put_item(TableName=table, Item=serialize(edge | {"GSI1SK": f"{FOLLOWING}r"}))
                self.faulted(quiet, "quiet/edge-without-counter")
            elif kind == 1:
                db.delete_item(TableName=table, Key=seed_edge)
                self.faulted(quiet, "quiet/delete-without-decrement")
            elif kind == 2:
                db.update_item(
                    TableName=table,
                    Key=seed_edge,
                    UpdateExpression="SET GSI1SK = :s",
                    ExpressionAttributeValues=serialize({":s": f"{BLOCKED}rogue"}),
                )
                self.faulted(quiet, "quiet/blocked-without-decrement")
            elif kind == 3:
                follow = {"pk": f"USER#legit-{quiet[5:]}", "sk": "FOLLOWS#0"}
                added = writer.add_child(follow, {"GSI1PK": quiet, "GSI1SK": f"{FOLLOWING}l"})
                assert added.outcome == "created", added
                time.sleep(1.0)
                db.update_item(
                    TableName=table,
                    Key=serialize({"pk": quiet, "sk": PROFILE}),
                    UpdateExpression="ADD followerCount :k",
                    ExpressionAttributeValues=serialize({":k": 3}),
                )
                self.faulted(quiet, "quiet/follow-then-rogue-add")
            else:  # re-pointed to a quiet followee of its own
                other = MOVED_TO[n]
                db.update_item(
                    TableName=table,
                    Key=seed_edge,
                    UpdateExpression="SET GSI1PK = :f",
                    ExpressionAttributeValues=serialize({":f": other}),
                )
                self.faulted(quiet, "quiet/moved-without-counts")
                self.faulted(other, "quiet/moved-without-counts")

    # --- judging ------------------------------------------------------------------------

    def judge(self, alerts: list[Alert], acknowledged: Acknowledged) -> Outcome:
        faults = self.faults + self.aggregator.faults
        broken = {f.pk for f in faults}
        outcome = Outcome(self.seed, alerts=[a.body for a in alerts])
        # An alert before its parent's first fault was not about the fault.
        first_fault = {pk: min(f.at for f in faults if f.pk == pk) for pk in broken}
        alerted = {alert_pk(a.body) for a in alerts if a.at >= first_fault.get(alert_pk(a.body), 0)}
        outcome.false_negatives = broken - alerted
        # A fault on the hot followee counts only if alerted while its writes went on.
        for fault in (f for f in faults if f.pk == HOT):
            if not any(
                fault.at <= a.at < self.hot_stopped for a in alerts if alert_pk(a.body) == HOT
            ):
                outcome.false_negatives.add(f"{HOT} {fault.kind}: not while its writes went on")
        outcome.false_positives = {
            alert_pk(a.body)
            for a in alerts
            if a.at < first_fault.get(alert_pk(a.body), float("inf"))
        }
        for fault in faults:
            # The first alert on its parent after it (one before it was on something else).
            first = min(
                (a.at for a in alerts if alert_pk(a.body) == fault.pk and a.at >= fault.at),
                default=None,
            )
            if first is not None:
                outcome.latencies.setdefault(fault.kind, []).append(first - fault.at)
        items = self.scan()
        lost = outcome.lost_writes
        for name, edge in sorted(acknowledged.edges.items()):
            item = items.get(tuple(name.split("/", 1)))  # type: ignore[arg-type]
            found = None
            if item is not None:
                status = FOLLOWING if str(item["GSI1SK"]).startswith(FOLLOWING) else BLOCKED
                found = (item["GSI1PK"], status)
            if found != (tuple(edge) if edge else None):
                lost.append(f"edge {name}: acknowledged {edge}, found {found}")
        for name, followee in sorted(self.hot_edges.items()):
            item = items.get(tuple(name.split("/", 1)))  # type: ignore[arg-type]
            if (None if item is None else item["GSI1PK"]) != followee:
                lost.append(f"edge {name}: acknowledged {followee}, found {item}")
        for name, quantity in sorted(acknowledged.lines.items()):
            item = items.get(tuple(name.split("/", 1)))  # type: ignore[arg-type]
            found = None if item is None else int(item["quantity"])
            if found != quantity:
                lost.append(f"line {name}: acknowledged {quantity}, found {found}")
        followers: defaultdict[str, int] = defaultdict(int)
        totals: defaultdict[str, Decimal] = defaultdict(Decimal)
        for (pk, sk), item in items.items():
            if sk.startswith("FOLLOWS#") and str(item.get("GSI1SK", "")).startswith(FOLLOWING):
                followers[item["GSI1PK"]] += 1
            if pk.startswith("cart#") and sk.startswith("product#"):
                totals[sk] += item["quantity"]
        for followee in [*FOLLOWEES, *QUIET, HOT]:
            counter = items.get((followee, PROFILE), {}).get("followerCount")
            if counter != followers[followee]:
                lost.append(f"{followee} counter {counter}, {followers[followee]} edges")
        for product in PRODUCTS:
            total = items.get((product, TOTAL), {}).get("quantity")
            if product not in broken and total != totals[product]:
                lost.append(f"{product} total {total}, lines {totals[product]}")
        # Only a broken followee's profile may be written, and only after it was broken.
        repairable = {f.pk for f in faults if f.kind.startswith(("count/", "quiet/", "hot/"))}
        outcome.harmful_writes = [
            f"{operation} {pk}/{sk}"
            for at, operation, pk, sk in self.calls.writes
            if not (sk == PROFILE and pk in repairable and at >= first_fault[pk])
        ]
        # A quiet followee's edges hold still after its fault: each repair must set it to
        # them (a repair to anything else, even one a later repair undid, is harmful).
        repairs = Store(self.stack.dynamodb, self.stack.audit_table).log.repairs()
        # The hot followee moves all along: each repair must move it by its fault's offset.
        hot = [
            r["before"] - r["after"]
            for r in sorted(repairs, key=lambda r: str(r.get("at", "")))
            if r["key"].get("pk") == HOT and r["status"] == "applied"
        ]
        if hot_repairs_harmful(hot, HOT_OFFSETS):
            outcome.harmful_writes.append(f"repairs of {HOT} by {hot}, faults of {HOT_OFFSETS}")
        for repair in repairs:
            pk = str(repair["key"].get("pk"))
            if pk in QUIET and repair["status"] == "applied" and repair["after"] != followers[pk]:
                outcome.harmful_writes.append(
                    f"repair of {pk} to {repair['after']}, {followers[pk]} edges"
                )
        outcome.cost = self.cost(acknowledged)
        return outcome

    def cost(self, acknowledged: Acknowledged) -> dict[str, dict[str, Any]]:
        """The reconciler's read units per rule against a naive recount per write."""
        per_followee = {
            f: self.query_units(GSI1, "GSI1PK", f, FOLLOWING) for f in [*FOLLOWEES, HOT]
        }
        per_product = {p: self.query_units(BY_PRODUCT, "sk", p) for p in PRODUCTS}
        naive_followers = sum(per_followee[f] for touched in acknowledged.touched for f in touched)
        naive_followers += per_followee[HOT] * self.hot_writes
        naive_products = sum(per_product[p] for p in acknowledged.line_products)
        reads, writes = self.calls.reads, self.calls.audit_writes

        def row(rule: str, child_writes: int, naive: float) -> dict[str, Any]:
            return {
                "writes": child_writes,
                "reconciler": round(reads.total(rule), 2),
                "reconciler_write_units": round(writes.total(rule), 2),
                "naive": round(naive, 2),
                "operations": {k: round(v, 2) for k, v in reads.units.get(rule, {}).items()},
                "write_operations": {k: round(v, 2) for k, v in writes.units.get(rule, {}).items()},
            }

        return {
            "followers": row(
                "followers", acknowledged.edge_writes + self.hot_writes, naive_followers
            ),
            "products": row("products", acknowledged.line_writes, naive_products),
        }

    def query_units(
        self, index: str, attribute: str, value: str, prefix: str | None = None
    ) -> float:
        """What one eventually consistent Query of ``value``'s index partition costs now."""
        condition = "#k = :v"
        values: dict[str, Any] = {":v": value}
        names = {"#k": attribute}
        if prefix is not None:
            condition += " AND begins_with(#s, :p)"
            values[":p"] = prefix
            names["#s"] = "GSI1SK"
        pages = self.stack.dynamodb.get_paginator("query").paginate(
            TableName=self.stack.table,
            IndexName=index,
            KeyConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=serialize(values),
            ReturnConsumedCapacity="TOTAL",
        )
        return float(sum(page["ConsumedCapacity"]["CapacityUnits"] for page in pages))

    def scan(self) -> dict[tuple[str, str], dict[str, Any]]:
        pages = self.stack.dynamodb.get_paginator("scan").paginate(
            TableName=self.stack.table, ConsistentRead=True
        )
        items = (deserialize(i) for page in pages for i in page["Items"])
        return {(i["pk"], i["sk"]): i for i in items}


def pooled(outcomes: list[Outcome]) -> dict[str, list[float]]:
    """Every run's latencies per fault kind, and per rule ("count", "sum")."""
    pool: dict[str, list[float]] = {}
    for outcome in outcomes:
        for kind, values in outcome.latencies.items():
            pool.setdefault(kind, []).extend(values)
            pool.setdefault(kind.split("/")[0] + " (all)", []).extend(values)
    return pool


def median_max(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values)


@contextlib.contextmanager
def index_stack(dynamodb_endpoint: str, moto_endpoint: str) -> Iterator[Any]:
    """A fresh stack for the scenario (its table, the audit table, topic and queues, the
    handlers' environment pointing at them and at live_index_rules.toml), inside or outside
    pytest; the environment and the handlers' cached clients are restored after."""

    def create_main(dynamodb: Any, table: str) -> None:
        create_table_from(dynamodb, index_table_kwargs(table), "expirationTime")

    with live_stack(
        dynamodb_endpoint, moto_endpoint, RULES_FILE, prefix="tally-idx", create_main=create_main
    ) as stack:
        yield stack
