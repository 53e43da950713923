"""What stream verification costs: our reconciler against a naive recount-per-child one.

Run by ``make bench-reconciler``. Uses ``DYNAMODB_ENDPOINT`` / ``AWS_ENDPOINT_URL_DYNAMODB`` when
set, else its own DynamoDB Local; SNS and SQS come from moto's server on loopback. Scenarios:

(a) one hot post: ``--likes`` seeded likes, then ``--churn`` likes and unlikes through the writers;
(b) ``--posts`` posts with 1-4 likes each through the writers;
then the stream is read in batches of 100 and every batch is verified by both reconcilers.
(c) in-process throughput of ``verify_batch`` on synthetic balanced batches, no I/O at all.

Exit 1 only if a correctness check fails (any finding: the writes are all legitimate, so every
finding is false drift); the goal lines are measurements, not gates.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar, cast

import boto3
from boto3.dynamodb.types import TypeDeserializer

from tally.core.aws import RETRY_CONFIG
from tally.core.dynamodb import serialize
from tally.core.streams import StreamReader, stream_arn
from tally.local.dynamodb_local import (
    VERSION,
    DynamoDBLocal,
    local_client_kwargs,
)
from tally.local.moto_server import moto_server
from tally.local.template import create_table, load_template, template_path
from tally.reconciler.repair.policy import RepairPolicy
from tally.reconciler.report.alerts import AlertPublisher
from tally.reconciler.report.rechecks import RecheckQueue, parse_recheck
from tally.reconciler.store.parts import Store
from tally.reconciler.table.access import Reads
from tally.reconciler.table.tally_table import TallyTable
from tally.reconciler.verification import Reconciler
from tally.rules import CountRule, RuleSet, SumRule, load_rules
from tally.writers.tallies import TallyWriter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.harness, as in benchmarks/live_faults.py
from tests.harness.endpoints import endpoint_from_env  # noqa: E402

RULE = "likes"
BATCH = 100
WRITER_THREADS = 4
SEED_THREADS = 4
RUNS = 5
GOAL_ITEMS = 100.0
GOAL_ITEMS_SPLIT = 10_000.0
GOAL_SMALL_UNITS = 1_500.0
GOAL_SHARE = 5.0
GOAL_RATE = 50_000.0
# The carry's window in the benchmark, and how long past it a rogue write may go unreported.
CARRY_SECONDS = 1
GOAL_DETECTION_MARGIN = 2.0
# A writer transaction writes the child and the parent (each under 1 KB): 2 WCU per item.
WCU_PER_WRITE = 4
Batches = list[list[dict[str, Any]]]


@dataclass
class Row:
    """One reconciler over one scenario's recorded batches."""

    scenario: str
    reconciler: str
    records: int = 0
    batches: int = 0
    groups: int = 0
    balanced: int = 0
    recounts: int = 0
    items: int = 0
    capacity: float = 0.0
    # The carry's reads and writes, and the rechecks its remainders scheduled (run after).
    carry_units: float = 0.0
    rechecks: int = 0
    share_of_writes: float | None = None
    seconds: float = 0.0
    findings: int = 0
    failed: int = 0
    deferred: int = 0
    # Naive rows on a large partition verify a sample of the batches and scale up by this.
    sampled_batches: int = 0
    scale: float = 1.0
    naive_over_ours: float | None = None
    kinds: dict[str, int] = field(default_factory=dict)


@dataclass
class Scenario:
    """What the writers did before verification, and the rows that verified it."""

    name: str
    writes: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    seed_seconds: float = 0.0
    write_seconds: float = 0.0
    discarded_records: int = 0
    truth_ok: bool = True
    truth_detail: str = ""
    rows: list[Row] = field(default_factory=list)
    detection: Detection | None = None


@dataclass
class Detection:
    """A rogue counter write on the hot post, from the write to its finding."""

    window: int = CARRY_SECONDS
    seconds: float | None = None
    expected: str = ""
    findings: list[str] = field(default_factory=list)
    recounts: int = 0

    @property
    def ok(self) -> bool:
        return self.findings == [self.expected] and self.seconds is not None


@dataclass
class Throughput:
    """``verify_batch`` on balanced synthetic batches against the bare key-decoding floor."""

    records: int
    posts: int
    runs: int
    ours_per_s: float = 0.0
    floor_per_s: float = 0.0
    ratio_to_floor: float = 0.0
    groups: int = 0
    balanced: int = 0
    failed: int = 0
    io_calls: list[str] = field(default_factory=list)
    ok: bool = True


# --- environment ---------------------------------------------------------------------------


@dataclass
class Stack:
    """One scenario's tables, topic, queue and clients."""

    dynamodb: Any
    streams: Any
    sns: Any
    sqs: Any
    table: str
    topic_arn: str
    rules: RuleSet
    exits: contextlib.ExitStack

    def reconciler(self) -> Reconciler:
        """Carry window 1 s, on an audit table and a recheck queue of its own: no row sees
        another's carries or rechecks."""
        suffix = uuid.uuid4().hex[:10]
        audit = f"tally-bench-audit-{suffix}"
        create_table(self.dynamodb, load_template(template_path()), "AuditTable", audit)
        self.exits.callback(self.dynamodb.delete_table, TableName=audit)
        queue_url = self.sqs.create_queue(QueueName=f"rechecks-{suffix}")["QueueUrl"]
        store = Store(self.dynamodb, audit)
        return Reconciler(
            self.rules,
            TallyTable(self.dynamodb, self.table, self.rules),
            store,
            AlertPublisher(self.sns, self.topic_arn, store.outbox),
            RecheckQueue(self.sqs, queue_url),
            RepairPolicy(),
            carry_seconds=CARRY_SECONDS,
        )


@contextlib.contextmanager
def stack(external: str | None, moto: str, rules: RuleSet) -> Iterator[Stack]:
    """Fresh tables on a fresh DynamoDB Local (unless one was given) for one scenario.

    DynamoDB Local slows down as it accumulates history, so a shared instance would
    penalise whichever scenario runs last.
    """
    with contextlib.ExitStack() as exits:
        endpoint = external or exits.enter_context(DynamoDBLocal()).endpoint
        local = local_client_kwargs(endpoint)
        # One client for all threads: RETRY_CONFIG's pool of 64 keeps the writers from queueing.
        dynamodb = boto3.client("dynamodb", config=RETRY_CONFIG, **local)
        suffix = uuid.uuid4().hex[:10]
        table = f"tally-bench-{suffix}"
        create_table(dynamodb, load_template(template_path()), "Table", table)
        exits.callback(dynamodb.delete_table, TableName=table)
        aws = local_client_kwargs(moto)
        sns, sqs = boto3.client("sns", **aws), boto3.client("sqs", **aws)
        topic_arn = sns.create_topic(Name=f"alerts-{suffix}")["TopicArn"]
        streams = boto3.client("dynamodbstreams", **local)
        yield Stack(dynamodb, streams, sns, sqs, table, topic_arn, rules, exits)


# --- writing -------------------------------------------------------------------------------


def batch_put(client: Any, table: str, items: Sequence[Mapping[str, Any]]) -> None:
    """Plain BatchWriteItem from a few threads: seeding is setup, not the measurement."""

    def put(chunk: Sequence[Mapping[str, Any]]) -> None:
        requests: list[dict[str, Any]] = [{"PutRequest": {"Item": serialize(i)}} for i in chunk]
        while requests:
            response = client.batch_write_item(RequestItems={table: requests})
            requests = response.get("UnprocessedItems", {}).get(table, [])

    chunks = [items[i : i + 25] for i in range(0, len(items), 25)]
    with ThreadPoolExecutor(SEED_THREADS) as pool:
        list(pool.map(put, chunks))


def discard_stream(reader: StreamReader) -> int:
    """Read past everything the seeding produced, so only the measured writes get verified."""
    return len(reader.drain(limit=1000))


def run_writes(writer: TallyWriter, ops: Sequence[tuple[str, dict[str, str]]]) -> Counter[str]:
    """Each op as its own writer transaction, from a few threads; returns the outcomes."""

    def one(op: tuple[str, dict[str, str]]) -> str:
        action, key = op
        result = writer.add_child(key) if action == "add" else writer.remove_child(key)
        return result.outcome

    with ThreadPoolExecutor(WRITER_THREADS) as pool:
        return Counter(pool.map(one, ops))


def record_batches(reader: StreamReader) -> Batches:
    """The measured writes' stream, in batches of up to 100 per shard as Lambda would get them."""
    batches: Batches = []
    idle = 0
    while idle < 2:
        polled = reader.poll_batches(BATCH)
        batches.extend(records for _, records in polled)
        idle = 0 if polled else idle + 1
    return batches


def check_truth(stack: Stack, scenario: Scenario, expected: Mapping[str, int]) -> None:
    """The writers' own correctness: each counter equals the children actually stored."""
    table = TallyTable(stack.dynamodb, stack.table, stack.rules)
    rule = rule_of(stack.rules)
    wrong = []
    for pk, likes in expected.items():
        key = {"PK": pk, "SK": "META"}
        counter = table.parents.read_parent(rule, key).counter
        actual = table.parents.tally_children(rule, key).actual
        if not counter == actual == likes:
            wrong.append(f"{pk}: likeTally={counter} children={actual} expected={likes}")
    scenario.truth_ok = not wrong
    scenario.truth_detail = "; ".join(wrong[:5]) or f"{len(expected)} counters match"


def rule_of(rules: RuleSet) -> CountRule:
    rule = rules[RULE]
    assert isinstance(rule, CountRule)
    return rule


# --- the two reconcilers -------------------------------------------------------------------


class NaiveReconciler:
    """Recounts the parent on every child record: the cost our fast path avoids.

    It also reads the parent's counter (one item) so that it can judge, like ours.
    """

    def __init__(self, rules: RuleSet, table: TallyTable):
        self.rules = rules
        self.table = table
        self.children = 0
        self.findings: list[str] = []

    def verify_batch(self, records: Sequence[Mapping[str, Any]]) -> None:
        for record in records:
            keys = {k: _KEYS.deserialize(v) for k, v in record["dynamodb"]["Keys"].items()}
            for match in self.rules.classify(keys):
                if match.role != "child" or not isinstance(match.rule, CountRule | SumRule):
                    continue
                self.children += 1
                tally = self.table.parents.tally_children(match.rule, match.parent_key)
                parent = self.table.parents.read_parent(match.rule, match.parent_key)
                stored = parent.counter if parent.counter is not None else Decimal(0)
                if parent.exists and stored != tally.actual:
                    self.findings.append(f"{match.parent_key}: {stored} != {tally.actual}")


_KEYS = TypeDeserializer()


def child_records(rules: RuleSet, batch: Sequence[Mapping[str, Any]]) -> int:
    """How many recounts the naive reconciler will do for this batch."""
    count = 0
    for record in batch:
        keys = {k: _KEYS.deserialize(v) for k, v in record["dynamodb"]["Keys"].items()}
        count += sum(m.role == "child" for m in rules.classify(keys))
    return count


def run_rechecks(stack: Stack, reconciler: Reconciler, timeout: float = 60) -> int:
    """Deliver every recheck the row scheduled (rechecks included) once its delay runs out,
    as the handler would; the row's queue is its own."""
    done, deadline, queue = 0, time.monotonic() + timeout, reconciler.rechecks.queue_url
    while done < reconciler.stats.rechecks:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{reconciler.stats.rechecks - done} rechecks never arrived")
        messages = stack.sqs.receive_message(
            QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", [])
        for message in messages:
            reconciler.recheck(parse_recheck(message["Body"]))
            stack.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
        done += len(messages)
    return done


def verify_ours(stack: Stack, scenario: str, label: str, batches: Batches) -> Row:
    reconciler = stack.reconciler()
    failed = 0
    start = time.perf_counter()
    for batch in batches:
        failed += len(reconciler.verify_batch(batch))
    seconds = time.perf_counter() - start
    rechecks = run_rechecks(stack, reconciler)  # their reads count; their waiting does not
    stats, reads = reconciler.stats, reconciler.table.reads
    return Row(
        scenario,
        label,
        records=stats.records,
        batches=len(batches),
        groups=stats.groups,
        balanced=stats.balanced,
        recounts=reads.recounts,
        items=reads.items,
        capacity=float(reads.capacity),
        carry_units=float(reconciler.store.carries.carry_units),
        rechecks=rechecks,
        seconds=seconds,
        findings=sum(stats.findings.values()),
        failed=failed,
        deferred=stats.deferred,
        sampled_batches=len(batches),
        kinds=dict(stats.findings),
    )


def verify_naive(stack: Stack, scenario: str, batches: Batches, budget: float) -> Row:
    """Naive verification of every batch, or of an evenly spaced sample when too slow.

    Recounting a 20,000-child parent takes about 0.1 s on DynamoDB Local, so 5,000 of them
    would take ten minutes. When batch 0 predicts more than ``budget`` seconds, only every
    k-th batch is verified and reads and time are scaled by the child records verified: on a
    table that no longer changes, every recount of a parent costs the same.
    """
    naive = NaiveReconciler(stack.rules, TallyTable(stack.dynamodb, stack.table, stack.rules))
    total_children = sum(child_records(stack.rules, b) for b in batches)
    start = time.perf_counter()
    chosen = batches[:1]
    if batches:
        naive.verify_batch(batches[0])
        per_child = (time.perf_counter() - start) / max(naive.children, 1)
        stride = 1
        if budget and per_child * total_children > budget:
            stride = math.ceil(per_child * total_children / budget)
        chosen += batches[stride::stride]
        for batch in batches[stride::stride]:
            naive.verify_batch(batch)
    seconds = time.perf_counter() - start
    reads: Reads = naive.table.reads
    scale = total_children / naive.children if naive.children else 1.0
    return Row(
        scenario,
        "naive",
        records=sum(len(b) for b in batches),
        batches=len(batches),
        groups=total_children,
        recounts=round(reads.recounts * scale),
        items=round(reads.items * scale),
        capacity=float(reads.capacity) * scale,
        seconds=seconds * scale,
        findings=len(naive.findings),
        sampled_batches=len(chosen),
        scale=scale,
        kinds={"drift": len(naive.findings)} if naive.findings else {},
    )


def shifted(batches: Batches) -> Batches:
    """The same records in batches of 100 that start one record earlier.

    A writer transaction puts two adjacent records on the stream, so batches of 100 read
    from an aligned start never split one; a single lone write (a title edit, a TTL delete)
    moves every later boundary into the middle of a transaction. A batch that then starts
    with one transaction's parent and ends with another's child of the same post is still
    balanced when both moved the counter the same way; otherwise it is recounted.
    """
    records = [r for batch in batches for r in batch]
    first = records[: BATCH - 1]
    rest = [records[i : i + BATCH] for i in range(BATCH - 1, len(records), BATCH)]
    return [first, *rest] if first else []


def compare(scenario: Scenario, stack: Stack, batches: Batches, budget: float) -> None:
    """Ours first (a cold JVM then penalises ours, not the baseline), then naive.

    Naive's cost is per child record, so one naive row serves both batchings of ours.
    """
    ours = verify_ours(stack, scenario.name, "ours", batches)
    moved = verify_ours(stack, scenario.name, "ours+1", shifted(batches))
    naive = verify_naive(stack, scenario.name, batches, budget)
    naive.naive_over_ours = 1.0
    writes_wcu = scenario.writes * WCU_PER_WRITE
    for row in (ours, moved):
        row.naive_over_ours = naive.items / row.items if row.items else math.inf
        row.share_of_writes = 100 * (row.capacity + row.carry_units) / writes_wcu
    scenario.rows += [ours, moved, naive]


# --- scenarios -----------------------------------------------------------------------------


def hot_post(external: str | None, moto: str, rules: RuleSet, args: argparse.Namespace) -> Scenario:
    """(a) One post with many likes, churned by likes and unlikes."""
    scenario = Scenario("a: 1 hot post")
    rng = random.Random(1)
    post = "POST#hot"
    with stack(external, moto, rules) as s:
        reader = StreamReader(s.streams, stream_arn(s.dynamodb, s.table))
        start = time.perf_counter()
        likes = [{"PK": post, "SK": f"LIKE#USER#{n:07d}"} for n in range(args.likes)]
        batch_put(s.dynamodb, s.table, likes)
        s.dynamodb.put_item(
            TableName=s.table,
            Item=serialize({"PK": post, "SK": "META", "likeTally": Decimal(args.likes)}),
        )
        scenario.discarded_records = discard_stream(reader)
        scenario.seed_seconds = time.perf_counter() - start

        # Half new likes, half unlikes of distinct seeded likes: every write really happens.
        unlikes = min(args.churn // 2, args.likes)
        gone = rng.sample(range(args.likes), unlikes)
        ops = [("remove", likes[n]) for n in gone]
        ops += [
            ("add", {"PK": post, "SK": f"LIKE#NEW#{n:07d}"}) for n in range(args.churn - unlikes)
        ]
        rng.shuffle(ops)
        start = time.perf_counter()
        scenario.outcomes = dict(run_writes(TallyWriter(s.dynamodb, s.table, rules), ops))
        scenario.write_seconds = time.perf_counter() - start
        scenario.writes = len(ops)
        check_truth(s, scenario, {post: args.likes + len(ops) - 2 * unlikes})

        batches = record_batches(reader)
        compare(scenario, s, batches, args.naive_seconds)
        likes = args.likes + len(ops) - 2 * unlikes
        scenario.detection = rogue_write(s, reader, {"PK": post, "SK": "META"}, likes)
    return scenario


def rogue_write(
    stack: Stack, reader: StreamReader, key: Mapping[str, str], likes: int
) -> Detection:
    """Add 7 to the hot post's counter by hand; time until the reconciler reports it.

    The record is carried like a transaction half, so it is found by the recheck after
    the window; the time includes reading the stream and the recount of every child.
    """
    reconciler = stack.reconciler()
    written = time.time()
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key=serialize(dict(key)),
        UpdateExpression="SET likeTally = likeTally + :n",
        ExpressionAttributeValues={":n": {"N": "7"}},
    )
    for batch in record_batches(reader):
        reconciler.verify_batch(batch)
    run_rechecks(stack, reconciler)
    found = reconciler.log
    detection = Detection(
        expected=f"drift: {likes + 7} -> {likes}",
        findings=[f"{f.kind}: {f.stored} -> {f.actual}" for f in found],
        recounts=reconciler.table.reads.recounts,
    )
    if found:
        detected = datetime.fromisoformat(found[0].detected_at.replace("Z", "+00:00"))
        detection.seconds = detected.timestamp() - written
    return detection


def many_posts(
    external: str | None, moto: str, rules: RuleSet, args: argparse.Namespace
) -> Scenario:
    """(b) Many posts with a few likes each."""
    scenario = Scenario(f"b: {args.posts} posts")
    rng = random.Random(2)
    with stack(external, moto, rules) as s:
        reader = StreamReader(s.streams, stream_arn(s.dynamodb, s.table))
        start = time.perf_counter()
        posts = [f"POST#{n:06d}" for n in range(args.posts)]
        parents = [{"PK": p, "SK": "META", "likeTally": Decimal(0)} for p in posts]
        batch_put(s.dynamodb, s.table, parents)
        scenario.discarded_records = discard_stream(reader)
        scenario.seed_seconds = time.perf_counter() - start

        expected = {p: rng.randint(1, 4) for p in posts}
        ops = [
            ("add", {"PK": p, "SK": f"LIKE#USER#{n}"})
            for p, k in expected.items()
            for n in range(k)
        ]
        # Interleaved across posts, as real traffic would be.
        rng.shuffle(ops)
        start = time.perf_counter()
        scenario.outcomes = dict(run_writes(TallyWriter(s.dynamodb, s.table, rules), ops))
        scenario.write_seconds = time.perf_counter() - start
        scenario.writes = len(ops)
        check_truth(s, scenario, expected)

        batches = record_batches(reader)
        compare(scenario, s, batches, args.naive_seconds)
    return scenario


# --- in-process throughput -----------------------------------------------------------------


class NoIO:
    """Stands in for the table, audit store, alerts and rechecks: any use of it, or of one of
    its parts (handed to the steps when the reconciler is built), is I/O."""

    PARTS: ClassVar[dict[str, set[str]]] = {
        "table": {"parents", "members", "writes"},
        "store": {"log", "standing", "outbox", "watermarks", "carries", "recent"},
    }

    def __init__(self, role: str, calls: list[str]):
        self._role = role
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        if name in self.PARTS.get(self._role, ()):
            return NoIO(f"{self._role}.{name}", self._calls)
        self._calls.append(f"{self._role}.{name}")
        raise AssertionError(f"I/O on a balanced batch: {self._role}.{name}")


def synthetic_batches(records: int, posts: int) -> Batches:
    """Balanced like transactions in Lambda's shape: child INSERT + parent MODIFY, 50 per batch."""
    rng = random.Random(3)
    tally = [0] * posts
    arn = "arn:aws:dynamodb:us-east-1:123456789012:table/bench/stream/2024-01-01T00:00:00.000"
    now = int(time.time())
    batches: Batches = []
    sequence = 0

    def record(name: str, keys: dict[str, Any], old: Any, new: Any) -> dict[str, Any]:
        nonlocal sequence
        sequence += 1
        dynamodb: dict[str, Any] = {
            "ApproximateCreationDateTime": now,
            "Keys": keys,
            "SequenceNumber": f"{sequence:021d}",
            "SizeBytes": 120,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        }
        if new is not None:
            dynamodb["NewImage"] = new
        if old is not None:
            dynamodb["OldImage"] = old
        return {
            "eventID": uuid.UUID(int=rng.getrandbits(128)).hex,
            "eventName": name,
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": "us-east-1",
            "dynamodb": dynamodb,
            "eventSourceARN": arn,
        }

    for start in range(0, records - records % 2, BATCH):
        batch = []
        for _ in range(min(BATCH, records - start) // 2):
            p = rng.randrange(posts)
            pk = {"S": f"POST#{p:06d}"}
            child = {"PK": pk, "SK": {"S": f"LIKE#USER#{sequence:09d}"}}
            batch.append(record("INSERT", child, None, {**child, "likedAt": {"N": str(now)}}))
            parent = {"PK": pk, "SK": {"S": "META"}}
            old = {
                **parent,
                "likeTally": {"N": str(tally[p])},
                "tallyRevision": {"N": str(tally[p])},
            }
            tally[p] += 1
            new = {
                **parent,
                "likeTally": {"N": str(tally[p])},
                "tallyRevision": {"N": str(tally[p])},
            }
            batch.append(record("MODIFY", parent, old, new))
        batches.append(batch)
    return batches


def best_of(runs: int, work: Callable[[], None]) -> float:
    best = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def throughput(rules: RuleSet, records: int, posts: int) -> Throughput:
    """Records/s of verify_batch on balanced batches, and of decoding just the keys."""
    batches = synthetic_batches(records, posts)
    n = sum(len(b) for b in batches)
    result = Throughput(n, posts, RUNS)
    calls: list[str] = []
    reconcilers: list[Reconciler] = []

    def ours() -> None:
        stub = cast(Any, NoIO)
        reconciler = Reconciler(
            rules,
            stub("table", calls),
            stub("store", calls),
            stub("alerts", calls),
            stub("rechecks", calls),
            RepairPolicy(),
        )
        for batch in batches:
            result.failed += len(reconciler.verify_batch(batch))
        reconcilers.append(reconciler)

    def floor() -> None:
        deserialize = TypeDeserializer().deserialize
        for batch in batches:
            for record in batch:
                {k: deserialize(v) for k, v in record["dynamodb"]["Keys"].items()}

    result.floor_per_s = n / best_of(RUNS, floor)
    result.ours_per_s = n / best_of(RUNS, ours)
    result.ratio_to_floor = result.ours_per_s / result.floor_per_s
    result.groups = sum(r.stats.groups for r in reconcilers)
    result.balanced = sum(r.stats.balanced for r in reconcilers)
    result.io_calls = sorted(set(calls))
    result.ok = not calls and not result.failed and result.groups == result.balanced
    return result


# --- report --------------------------------------------------------------------------------


def ratio_text(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "inf" if math.isinf(value) else f"{value:,.1f}x"


def table_text(scenarios: list[Scenario]) -> str:
    """The results as a fixed-width table."""
    head = (
        f"{'scenario':<16} {'reconciler':<10} {'records':>7} {'batches':>7} {'groups':>7} "
        f"{'recounts':>8} {'items read':>12} {'read cap':>10} {'carry RU':>8} {'RU/batch':>8} "
        f"{'%writes':>7} {'wall s':>8} {'findings':>8} {'failed':>6} {'naive/ours':>10}  note"
    )
    lines = [head, "-" * len(head)]
    for s in scenarios:
        for r in s.rows:
            note = ""
            share = "" if r.share_of_writes is None else f"{r.share_of_writes:.2f}"
            if r.reconciler.startswith("ours"):
                note = f"{r.rechecks} rechecks run"
            elif r.scale != 1.0:
                note = f"sampled {r.sampled_batches}/{r.batches} batches, scaled x{r.scale:.1f}"
            lines.append(
                f"{s.name:<16} {r.reconciler:<10} {r.records:>7} {r.batches:>7} {r.groups:>7} "
                f"{r.recounts:>8,} {r.items:>12,} {r.capacity:>10,.1f} {r.carry_units:>8,.1f} "
                f"{(r.capacity + r.carry_units) / max(r.batches, 1):>8.2f} {share:>7} "
                f"{r.seconds:>8.2f} {r.findings:>8} {r.failed:>6} "
                f"{ratio_text(r.naive_over_ours):>10}  {note}"
            )
    return "\n".join(lines)


def setup_text(scenarios: list[Scenario]) -> str:
    lines = []
    for s in scenarios:
        outcomes = ", ".join(f"{k}={v}" for k, v in sorted(s.outcomes.items()))
        lines.append(
            f"{s.name}: seeded in {s.seed_seconds:.1f}s ({s.discarded_records} stream records "
            f"discarded); {s.writes} writer transactions in {s.write_seconds:.1f}s ({outcomes}); "
            f"counters {'ok' if s.truth_ok else 'WRONG'}: {s.truth_detail}"
        )
    return "\n".join(lines)


def throughput_text(t: Throughput) -> str:
    io = ", ".join(t.io_calls) or "none"
    return (
        f"verify_batch, balanced batches of {BATCH} over {t.posts} posts, {t.records} records, "
        f"best of {t.runs}:\n"
        f"  ours  {t.ours_per_s:>12,.0f} records/s  ({1e6 / t.ours_per_s:.1f} us/record)\n"
        f"  floor {t.floor_per_s:>12,.0f} records/s  (TypeDeserializer on Keys only)\n"
        f"  ours/floor {t.ratio_to_floor:.2f}; groups {t.groups}, balanced {t.balanced}, "
        f"failed {t.failed}, I/O calls: {io}"
    )


def verdict(ok: bool, detail: str) -> str:
    return f"{'PASS' if ok else 'FAIL'} ({detail})"


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios and the throughput test, print the table and goals, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--likes", type=int, default=20_000, help="(a) seeded likes")
    parser.add_argument("--churn", type=int, default=5_000, help="(a) likes and unlikes")
    parser.add_argument("--posts", type=int, default=5_000, help="(b) posts, 1-4 likes each")
    parser.add_argument(
        "--naive-seconds",
        type=float,
        default=30.0,
        help="per scenario; past it the naive reconciler samples batches (0: verify all)",
    )
    parser.add_argument("--records", type=int, default=50_000, help="(c) synthetic records")
    parser.add_argument("--synthetic-posts", type=int, default=10_000, help="(c) posts spread")
    parser.add_argument(
        "--json", type=Path, default=REPO / "benchmarks/results/bench_reconciler.json"
    )
    args = parser.parse_args(argv)
    rules = load_rules(REPO / "src/rules.toml")

    external = endpoint_from_env()
    with moto_server() as moto:
        scenarios = []
        for run in (hot_post, many_posts):
            scenario = run(external, moto, rules, args)
            print(f"  {scenario.name}: done", file=sys.stderr)
            scenarios.append(scenario)
    speed = throughput(rules, args.records, args.synthetic_posts)

    ratios = {r.reconciler: r.naive_over_ours or 0.0 for r in scenarios[0].rows}
    hot, hot_moved = ratios["ours"], ratios["ours+1"]
    hot_share = next(r for r in scenarios[0].rows if r.reconciler == "ours+1").share_of_writes
    small = next(r for r in scenarios[1].rows if r.reconciler == "ours+1")
    small_units = small.capacity + small.carry_units
    false_drift = sum(r.findings for s in scenarios for r in s.rows)
    detection = scenarios[0].detection or Detection()
    failed = sum(r.failed for s in scenarios for r in s.rows)
    goals = {
        "a_items": (hot >= GOAL_ITEMS, f"naive/ours items {ratio_text(hot)}, goal >= 100x"),
        "a_items_shifted": (
            hot_moved >= GOAL_ITEMS_SPLIT,
            f"naive/ours+1 items {ratio_text(hot_moved)}, goal >= {GOAL_ITEMS_SPLIT:,.0f}x",
        ),
        "a_share_of_writes": (
            (hot_share or 0.0) <= GOAL_SHARE,
            f"reconciler RU {hot_share or 0.0:.2f}% of the writes' WCU, goal <= {GOAL_SHARE}%",
        ),
        "b_units": (
            small_units <= GOAL_SMALL_UNITS,
            f"ours+1 RU {small_units:,.1f} (reads + carry), goal <= {GOAL_SMALL_UNITS:,.0f}",
        ),
        "zero_false_drift": (false_drift == 0, f"{false_drift} findings"),
        "a_detection": (
            detection.ok and (detection.seconds or 0) <= detection.window + GOAL_DETECTION_MARGIN,
            f"rogue write found in {detection.seconds or 0:.2f} s "
            f"({', '.join(detection.findings) or 'no finding'}), "
            f"goal <= window {detection.window} s + {GOAL_DETECTION_MARGIN:.0f} s",
        ),
        "throughput": (
            speed.ours_per_s >= GOAL_RATE,
            f"{speed.ours_per_s:,.0f} records/s, goal >= {GOAL_RATE:,.0f}",
        ),
    }
    print(setup_text(scenarios))
    print()
    print(table_text(scenarios))
    print(
        "ours: batches as read from the stream; ours+1: the same records in batches starting "
        "one record earlier;\nnaive: groups = child records, each recounted (with a parent read);"
        f"\ncarry RU: the carry's reads and writes; RU/batch: read cap + carry RU per batch; "
        f"%writes: of the writes' own WCU ({WCU_PER_WRITE} per like transaction)"
    )
    print()
    print(throughput_text(speed))
    print()
    print(
        f"Goal (a) >= {GOAL_ITEMS:.0f}x fewer items read than naive: {verdict(*goals['a_items'])}"
    )
    print(
        "Goal (a), batches shifted by one record (every boundary splits a transaction): "
        + verdict(*goals["a_items_shifted"])
    )
    print(f"Goal (a) reconciler RU vs writes' WCU: {verdict(*goals['a_share_of_writes'])}")
    print(f"Goal (b) request units, every boundary split: {verdict(*goals['b_units'])}")
    print(f"Goal zero false drift in (a) and (b): {verdict(*goals['zero_false_drift'])}")
    print(f"Goal (a) detection of a rogue write: {verdict(*goals['a_detection'])}")
    print(f"Goal throughput >= {GOAL_RATE:,.0f} records/s: {verdict(*goals['throughput'])}")
    problems = []
    if false_drift:
        problems.append(f"{false_drift} false drift findings")
    if failed:
        problems.append(f"{failed} batch items reported failed")
    if not speed.ok:
        problems.append("balanced batches did I/O or were not all balanced")
    problems += [f"{s.name}: writers left wrong counters" for s in scenarios if not s.truth_ok]
    if not detection.ok:
        problems.append(f"the rogue write gave {detection.findings or 'no finding'}")
    if problems:
        print(f"Correctness FAILED: {'; '.join(problems)}")

    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "dynamodb": "external, version unknown" if external else f"DynamoDB Local {VERSION}",
        },
        "parameters": {
            "likes": args.likes,
            "churn": args.churn,
            "posts": args.posts,
            "naive_seconds": args.naive_seconds,
            "records": args.records,
            "synthetic_posts": args.synthetic_posts,
            "batch": BATCH,
            "rule": RULE,
        },
        "goals": {name: {"pass": ok, "detail": detail} for name, (ok, detail) in goals.items()},
        # JSON has no infinity: a ratio over zero items read is written as null.
        "scenarios": [
            asdict(s)
            | {
                "rows": [
                    asdict(r)
                    | {
                        "naive_over_ours": None
                        if r.naive_over_ours is None or math.isinf(r.naive_over_ours)
                        else r.naive_over_ours
                    }
                    for r in s.rows
                ]
            }
            for s in scenarios
        ],
        "throughput": asdict(speed),
        "correct": not problems,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"JSON: {args.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
