"""What the full audit costs at table scale: the scan engine against export + DuckDB.

Run by ``make bench-audit``. Uses ``DYNAMODB_ENDPOINT`` / ``AWS_ENDPOINT_URL_DYNAMODB`` when
set, else its own DynamoDB Local per size; SNS and SQS come from moto's server on loopback.

For each table size a table is loaded with posts and likes (count rule), orders and lines
(sum rule), projects and issues (collection sequence) and users (index sequence), with a
planted set of drifts, orphans, gaps, duplicates and counters behind. Then, each in its own
process so that its peak RSS is its own, each with a fresh audit table, both as dry runs:

- scan: ``full_audit``, the parallel scan (every item read with capacity);
- export: ``tally export`` (locally a parallel scan standing in for DynamoDB's export, which
  reads no capacity), the audit query on DuckDB over the files, then the candidates'
  recounts and rechecks.

Both must report exactly the planted findings: exit 1 if either does not. The timings are
measurements, not gates.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import queue
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3

from tally.core.aws import RETRY_CONFIG
from tally.local.dynamodb_local import (
    VERSION,
    DynamoDBLocal,
    local_client_kwargs,
)
from tally.local.moto_server import moto_server
from tally.local.template import create_table, create_table_kwargs, load_template, template_path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.harness, as in benchmarks/live_faults.py
from tests.harness.endpoints import endpoint_from_env  # noqa: E402

RULES_FILE = REPO / "src" / "rules.toml"
SIZES = (100_000, 1_000_000)
LOAD_THREADS = 8
PER_KIND = 10  # planted problems of each kind, whatever the size
Finding = tuple[str, str, str, int | None]  # kind, rule, partition key, number


# --- the table -----------------------------------------------------------------------------


def s(value: str) -> dict[str, str]:
    return {"S": value}


def n(value: Any) -> dict[str, str]:
    return {"N": f"{Decimal(value).normalize():f}"}


@dataclass
class Plan:
    """The table to load: its shape, and the problems planted in it."""

    size: int
    seed: int
    posts: int = 0
    orders: int = 0
    projects: int = 0
    users: int = 0
    planted: set[Finding] = field(default_factory=set)

    def __post_init__(self) -> None:
        # Shares of the items: 60% posts with 5-13 likes, 25% orders with 1-7 lines,
        # 14% projects with 40-60 issues, 1% users numbered by the index-layout sequence.
        self.posts, self.orders = int(self.size * 0.60 / 10), int(self.size * 0.25 / 5)
        self.projects, self.users = int(self.size * 0.14 / 51), int(self.size * 0.01)
        rng = random.Random(self.seed)
        self.lasts = [rng.randint(40, 60) for _ in range(self.projects)]
        self.drifted_posts = set(rng.sample(range(self.posts), PER_KIND))
        self.drifted_orders = set(rng.sample(range(self.orders), PER_KIND))
        odd = rng.sample(range(self.projects), 3 * PER_KIND)
        self.gaps = {p: rng.randint(1, self.lasts[p]) for p in odd[:PER_KIND]}
        self.duplicates = {p: rng.randint(1, self.lasts[p]) for p in odd[PER_KIND : 2 * PER_KIND]}
        self.behind = set(odd[2 * PER_KIND :])
        self.user_gap = rng.randint(1, self.users)
        planted = self.planted
        planted |= {("drift", "likes", self.post(p), None) for p in self.drifted_posts}
        planted |= {("orphans", "likes", self.orphan(o), None) for o in range(PER_KIND)}
        planted |= {("drift", "order-total", self.order(o), None) for o in self.drifted_orders}
        planted |= {("gap", "issue-numbers", self.project(p), k) for p, k in self.gaps.items()}
        planted |= {
            ("duplicate", "issue-numbers", self.project(p), k) for p, k in self.duplicates.items()
        }
        planted |= {("counter_behind", "issue-numbers", self.project(p), None) for p in self.behind}
        planted.add(("gap", "user-numbers", "UserMetadata", self.user_gap))

    @staticmethod
    def post(index: int) -> str:
        return f"POST#{index:08d}"

    @staticmethod
    def orphan(index: int) -> str:
        return f"POST#orphan{index:03d}"

    @staticmethod
    def order(index: int) -> str:
        return f"ORDER#{index:08d}"

    @staticmethod
    def project(index: int) -> str:
        return f"PROJECT#{index:06d}"

    def items(self) -> Iterator[dict[str, Any]]:
        rng = random.Random(self.seed + 1)
        for index in range(self.posts):
            likes, pk = rng.randint(5, 13), self.post(index)
            counter = likes + (rng.randint(1, 3) if index in self.drifted_posts else 0)
            yield {"PK": s(pk), "SK": s("META"), "likeTally": n(counter), "tallyRevision": n(1)}
            for like in range(likes):
                yield {"PK": s(pk), "SK": s(f"LIKE#USER#{like:04d}"), "likedAt": n(1736985600)}
        for index in range(PER_KIND):
            yield {"PK": s(self.orphan(index)), "SK": s("LIKE#USER#0001")}
        for index in range(self.orders):
            pk = self.order(index)
            lines = [Decimal(rng.randint(1, 99_999)).scaleb(-2) for _ in range(rng.randint(1, 7))]
            total = sum(lines, Decimal(0))
            total += Decimal("0.01") if index in self.drifted_orders else 0
            yield {"PK": s(pk), "SK": s("META"), "total": n(total), "tallyRevision": n(1)}
            for line, amount in enumerate(lines, start=1):
                yield {"PK": s(pk), "SK": s(f"LINE#{line:03d}"), "amount": n(amount)}
        for index, last in enumerate(self.lasts):
            pk = self.project(index)
            counter = last - 2 if index in self.behind else last
            yield {"PK": s(pk), "SK": s("COUNTER#ISSUE"), "lastIssue": n(counter)}
            for number in range(1, last + 1):
                if self.gaps.get(index) != number:
                    yield {"PK": s(pk), "SK": s(f"ISSUE#{number:010d}"), "title": s("issue")}
            if index in self.duplicates:
                # The same number a second time, under a key padded to another width.
                sk = f"ISSUE#{self.duplicates[index]:09d}"
                yield {"PK": s(pk), "SK": s(sk), "title": s("again")}
        yield {"PK": s("UserMetadata"), "SK": s("META"), "LastID": n(self.users)}
        for user in range(1, self.users + 1):
            if user != self.user_gap:
                yield {
                    "PK": s(f"User#{user:08d}"),
                    "SK": s("PROFILE"),
                    "seqName": s("user-numbers"),
                    "NumIdentifier": n(user),
                }


def load(client: Any, table: str, items: Iterator[dict[str, Any]]) -> int:
    """BatchWriteItem from a few threads, a bounded number of batches in flight."""
    batches: queue.Queue[list[dict[str, Any]] | None] = queue.Queue(LOAD_THREADS * 4)
    errors: list[BaseException] = []

    def writer() -> None:
        while (batch := batches.get()) is not None:
            try:
                request = {table: [{"PutRequest": {"Item": item}} for item in batch]}
                while request:
                    request = client.batch_write_item(RequestItems=request)["UnprocessedItems"]
            except BaseException as error:
                errors.append(error)

    threads = [threading.Thread(target=writer) for _ in range(LOAD_THREADS)]
    for thread in threads:
        thread.start()
    count, batch = 0, []
    for item in items:
        batch.append(item)
        count += 1
        if len(batch) == 25:
            batches.put(batch)
            batch = []
    if batch:
        batches.put(batch)
    for _ in threads:
        batches.put(None)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return count


# --- one engine, in its own process --------------------------------------------------------


def run_engine(engine: str, out: Path) -> dict[str, Any]:
    """The audit with ``engine`` on the tables the environment names; a dry run."""
    from tally.audit.full_audit import Audit, audited_rules, full_audit
    from tally.audit.sql import AuditQuery
    from tally.local.audit_duckdb import candidates
    from tally.local.exports import write_export
    from tally.reconciler import runtime
    from tally.reconciler.repair.policy import RepairPolicy

    checker = runtime.reconciler(RepairPolicy(enabled=True, dry_run=True, budget=10**9))
    phases: dict[str, float] = {}
    started = time.monotonic()
    if engine == "floor":
        report: dict[str, Any] = {}
    elif engine == "scan":
        report = full_audit(checker, segments=4).as_json()
    else:
        export = write_export(checker.table.client, checker.table.name, out, segments=4)
        phases["export"] = time.monotonic() - started
        rules = audited_rules(checker)
        query = AuditQuery(rules, checker.rules.table)
        found = list(candidates(query, export, checker.rules))
        phases["query"] = time.monotonic() - started - phases["export"]
        audit = Audit(checker, rules, "duckdb")
        audit.check_candidates(found, defer=False)
        phases["checks"] = time.monotonic() - started - phases["export"] - phases["query"]
        report = audit.finish().as_json() | {"export_items": export.item_count}
    reads = checker.table.reads
    return {
        "engine": engine,
        "seconds": time.monotonic() - started,
        "phases": phases,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "report": report,
        "recount_items": reads.items,
        "recount_capacity": float(reads.capacity),
        "findings": sorted([f.kind, f.rule, f.key["PK"], f.number] for f in checker.log),
    }


def scan_cpu(items: int = 200_000) -> float:
    """The scan engine's own cost per item, no I/O: deserialize, classify, tally (µs)."""
    from tally.audit.scan import _Entry, _tally
    from tally.core.dynamodb import deserialize
    from tally.rules import load_rules

    rules = load_rules(RULES_FILE)
    raw = list(itertools.islice(Plan(items * 2, 7).items(), items))
    best = float("inf")
    for _ in range(3):
        collection: dict[tuple[str, str], _Entry] = {}
        # CPU time, not wall time: the machine may be shared.
        started = time.process_time()
        for page in raw:
            item = deserialize(page)
            for match in rules.classify(item):
                _tally(collection, match.rule, match.role, match.parent_key, item)
        best = min(best, time.process_time() - started)
    return best / len(raw) * 1e6


@dataclass
class Row:
    """One engine over one table size."""

    size: int
    engine: str
    items: int
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    scan_items: int = 0
    scan_capacity: float = 0.0
    recount_items: int = 0
    recount_capacity: float = 0.0
    candidates: int = 0
    findings: int = 0
    exact: bool = False
    missed: list[Any] = field(default_factory=list)
    extra: list[Any] = field(default_factory=list)


def measure(
    size: int, external: str | None, moto: str, seed: int
) -> tuple[list[Row], dict[str, Any]]:
    plan = Plan(size, seed)
    with contextlib.ExitStack() as exits:
        endpoint = external or exits.enter_context(DynamoDBLocal()).endpoint
        dynamodb = boto3.client("dynamodb", config=RETRY_CONFIG, **local_client_kwargs(endpoint))
        template = load_template(template_path())
        suffix = uuid.uuid4().hex[:8]
        table = f"tally-bench-audit-{suffix}"
        kwargs = create_table_kwargs(template, "Table", table)
        kwargs.pop("StreamSpecification", None)  # nothing reads it here: no records to keep
        dynamodb.create_table(**kwargs)
        exits.callback(dynamodb.delete_table, TableName=table)
        started = time.monotonic()
        items = load(dynamodb, table, plan.items())
        loading = {"items": items, "seconds": time.monotonic() - started}
        loading["items_per_s"] = items / loading["seconds"]
        print(f"{size:>9}: loaded {items} items at {loading['items_per_s']:,.0f}/s", flush=True)
        aws = local_client_kwargs(moto)
        sns, sqs = boto3.client("sns", **aws), boto3.client("sqs", **aws)
        rows = []
        for engine in ("floor", "scan", "export"):
            audit_table = f"tally-bench-state-{engine}-{suffix}"
            create_table(dynamodb, template, "AuditTable", audit_table)
            exits.callback(dynamodb.delete_table, TableName=audit_table)
            env = {
                **os.environ,
                "TABLE_NAME": table,
                "AUDIT_TABLE_NAME": audit_table,
                "ALERT_TOPIC_ARN": sns.create_topic(Name=f"alerts-{suffix}")["TopicArn"],
                "RECHECK_QUEUE_URL": sqs.create_queue(QueueName=f"rechecks-{suffix}")["QueueUrl"],
                "RULES_FILE": str(RULES_FILE),
                "DYNAMODB_ENDPOINT": endpoint,
                "SNS_ENDPOINT": moto,
                "SQS_ENDPOINT": moto,
                "POWERTOOLS_SERVICE_NAME": "tally-bench",
                "POWERTOOLS_METRICS_NAMESPACE": "TallyBench",
                "POWERTOOLS_TRACE_DISABLED": "true",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
            }
            with tempfile.TemporaryDirectory(prefix="tally-bench-export-") as out:
                done = subprocess.run(
                    [sys.executable, __file__, "engine", engine, "--out", out],
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row_of(size, items, result, plan.planted))
            print(f"{size:>9}: {engine} took {result['seconds']:.1f} s", flush=True)
        return rows, loading


def row_of(size: int, items: int, result: dict[str, Any], planted: set[Finding]) -> Row:
    report = result["report"]
    found = {tuple(f) for f in result["findings"]}
    return Row(
        size=size,
        engine=result["engine"],
        items=items,
        seconds=result["seconds"],
        phases=result["phases"],
        peak_rss_mb=result["peak_rss_mb"],
        scan_items=report.get("items_scanned", 0),
        scan_capacity=report.get("read_capacity", 0.0),
        recount_items=result["recount_items"],
        recount_capacity=result["recount_capacity"],
        candidates=report.get("candidates", 0),
        findings=len(found),
        exact=found == planted if result["engine"] != "floor" else True,
        missed=sorted(planted - found, key=str) if result["engine"] != "floor" else [],
        extra=sorted(found - planted, key=str),
    )


# --- reporting -------------------------------------------------------------------------------


def table_text(rows: list[Row], planted: int) -> str:
    header = (
        f"{'items':>9} {'engine':<7} {'wall s':>7} {'phases s':<24} {'RSS MB':>7} "
        f"{'read w/ capacity':>16} {'RCU':>9} {'recount':>8} {'cand.':>6} {'findings':>9}"
    )
    lines = [header, "-" * len(header)]
    by_size: dict[int, dict[str, Row]] = {}
    for row in rows:
        by_size.setdefault(row.size, {})[row.engine] = row
    for row in rows:
        if row.engine == "floor":
            continue
        phases = " ".join(f"{k[0]}{v:.1f}" for k, v in row.phases.items()) or "-"
        verdict = f"{row.findings}/{planted} " + ("exact" if row.exact else "WRONG")
        lines.append(
            f"{row.items:>9} {row.engine:<7} {row.seconds:>7.1f} {phases:<24} "
            f"{row.peak_rss_mb:>7.0f} {row.scan_items:>16,} {row.scan_capacity:>9,.0f} "
            f"{row.recount_items:>8,} {row.candidates:>6,} {verdict:>9}"
        )
    lines.append("")
    for size, engines in by_size.items():
        scan, export, floor = engines["scan"], engines["export"], engines["floor"]
        query = export.phases.get("query", 0.0) + export.phases.get("checks", 0.0)
        above = [row.peak_rss_mb - floor.peak_rss_mb for row in (scan, export)]
        lines.append(
            f"{size:>9}: export/scan wall {export.seconds / scan.seconds:.2f}x "
            f"(query + checks alone {query / scan.seconds:.2f}x); RSS above the "
            f"{floor.peak_rss_mb:.0f} MB floor: scan {above[0]:.0f} MB, export {above[1]:.0f} MB"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    engine = commands.add_parser("engine", help="(internal) run one engine, print JSON")
    engine.add_argument("name", choices=["floor", "scan", "export"])
    engine.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks/results/bench_audit.json")
    args = parser.parse_args(argv)
    if args.command == "engine":
        print(json.dumps(run_engine(args.name, args.out)))
        return 0

    external = endpoint_from_env()
    rows: list[Row] = []
    loads: dict[int, Any] = {}
    with moto_server() as moto:
        for size in args.sizes:
            measured, loads[size] = measure(size, external, moto, args.seed)
            rows += measured
    planted = len(Plan(args.sizes[0], args.seed).planted)
    per_item = scan_cpu()
    print()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    print(f"DynamoDB Local {VERSION}, {machine}")
    print(table_text(rows, planted))
    print(f"scan engine's own CPU per item (deserialize, classify, tally): {per_item:.1f} µs")
    for row in rows:
        if not row.exact:
            print(f"{row.size} {row.engine}: missed {row.missed}, extra {row.extra}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"loads": loads, "scan_cpu_us_per_item": per_item, "rows": [asdict(r) for r in rows]},
            indent=2,
            default=str,
        )
    )
    return 0 if all(row.exact for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
