"""Throughput of the sequence allocation strategies under concurrent clients.

Run by ``make bench-writers``. Uses ``DYNAMODB_ENDPOINT`` / ``AWS_ENDPOINT_URL_DYNAMODB`` when
set, else its own DynamoDB Local. Exit 1 only if a correctness check fails: the goal line is a
measurement, not a gate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import boto3

from tally.core.aws import RETRY_CONFIG
from tally.local.dynamodb_local import (
    VERSION,
    DynamoDBLocal,
    local_client_kwargs,
)
from tally.local.template import create_table, load_template, template_path
from tally.rules import CollectionMembers, RuleSet, SequenceRule, load_rules
from tally.writers.sequences import SequenceAllocator, Strategy

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.harness, as in benchmarks/live_faults.py
from tests.harness.endpoints import endpoint_from_env  # noqa: E402

RULE = "issue-numbers"
BLOCK = 25
# (label, strategy, numbers per call); gapless is the baseline every ratio is taken against.
CELLS: list[tuple[str, Strategy, int]] = [
    ("atomic", "atomic", 1),
    ("gapless", "gapless", 1),
    ("sortkey", "sortkey", 1),
    (f"block({BLOCK})", "block", BLOCK),
]
GOAL_CLIENTS = 16
GOAL = f"block({BLOCK}) numbers/s >= 10x gapless at {GOAL_CLIENTS} clients"


@dataclass
class Cell:
    """One (strategy, concurrency) measurement and its verification."""

    strategy: str
    clients: int
    counter_key: dict[str, str]
    seconds: float = 0.0
    calls: int = 0
    numbers: int = 0
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    counter: int = 0
    members: int = 0
    ok: bool = True
    verdict: str = ""
    numbers_per_s: float = 0.0
    retries_per_number: float = 0.0
    vs_gapless: float | None = None


def run_cell(
    allocator: SequenceAllocator, case: tuple[str, Strategy, int], clients: int, secs: float
) -> tuple[Cell, list[int]]:
    """Hammer a fresh counter from ``clients`` threads for ``secs``; return what they got."""
    label, strategy, count = case
    key = {
        "PK": f"PROJECT#bench-{strategy}-{clients}-{uuid.uuid4().hex[:8]}",
        "SK": "COUNTER#ISSUE",
    }
    cell, go, lock = Cell(label, clients, key), threading.Event(), threading.Lock()
    returned: list[int] = []
    errors: Counter[str] = Counter()
    deadline = [0.0]

    def worker() -> None:
        # Tally per thread and merge once, so the lock never sits in the measured loop.
        got: list[int] = []
        calls = retries = 0
        failed: Counter[str] = Counter()
        go.wait()
        while time.monotonic() < deadline[0]:
            try:
                allocation = allocator.allocate(key, strategy=strategy, count=count)
            except Exception as error:  # counted and shown: contention failures are a result
                failed[type(error).__name__] += 1
                continue
            got.extend(allocation.numbers)
            calls += 1
            retries += allocation.retries
        with lock:
            returned.extend(got)
            errors.update(failed)
            cell.calls += calls
            cell.retries += retries

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    start = time.monotonic()
    deadline[0] = start + secs
    go.set()
    for thread in threads:
        thread.join()
    # Calls in flight at the deadline still count, so divide by the time until the last ends.
    cell.seconds = time.monotonic() - start
    cell.numbers, cell.errors = len(returned), dict(errors)
    cell.numbers_per_s = cell.numbers / cell.seconds
    cell.retries_per_number = cell.retries / cell.numbers if cell.numbers else 0.0
    return cell, returned


def verify(
    allocator: SequenceAllocator, rule: SequenceRule, cell: Cell, returned: list[int]
) -> None:
    """Check the collection: 1..N exactly (atomic: unique, within 1..counter)."""
    client, table, key = allocator.client, allocator.table_name, cell.counter_key
    item = client.get_item(
        TableName=table, Key={n: {"S": v} for n, v in key.items()}, ConsistentRead=True
    )
    cell.counter = int(item.get("Item", {}).get(rule.counter, {"N": "0"})["N"])
    members: list[int] = []
    prefix = rule.members.prefix if isinstance(rule.members, CollectionMembers) else ""
    pages = client.get_paginator("query").paginate(
        TableName=table,
        KeyConditionExpression="PK = :pk AND begins_with(SK, :prefix)",
        ExpressionAttributeValues={":pk": {"S": key["PK"]}, ":prefix": {"S": prefix}},
        ConsistentRead=True,
    )
    for page in pages:
        members += [n for i in page["Items"] if (n := rule.member_number(i["SK"]["S"])) is not None]
    # Members cannot repeat (the number is in the sort key); the risk is two callers told
    # the same number, so the numbers the threads got are checked against the members too.
    cell.members, unique = len(members), set(members)
    problems = []
    if cell.strategy == "atomic":
        if not unique <= set(range(1, cell.counter + 1)):
            problems.append(f"members outside 1..{cell.counter}")
    elif sorted(members) != list(range(1, len(members) + 1)) or cell.counter != len(members):
        problems.append(f"not 1..N (N={len(members)}, counter={cell.counter})")
    # Two callers handed the same number is the failure a sequence exists to prevent.
    if len(set(returned)) != len(returned):
        problems.append(f"{len(returned) - len(set(returned))} numbers returned twice")
    if not set(returned) <= unique:
        problems.append("returned numbers without members")
    cell.ok = not problems
    gaps = f", {cell.counter - cell.members} gaps" if cell.strategy == "atomic" else ""
    cell.verdict = ("ok" + gaps) if cell.ok else "FAIL: " + "; ".join(problems)


def table_text(cells: list[Cell]) -> str:
    """The results as a fixed-width table."""
    head = (
        f"{'strategy':<10} {'clients':>7} {'numbers':>8} {'numbers/s':>10} {'retries/n':>9} "
        f"{'vs gapless':>10}  {'errors':<24} verdict"
    )
    lines = [head, "-" * len(head)]
    for c in cells:
        ratio = "n/a" if c.vs_gapless is None else f"{c.vs_gapless:.2f}x"
        errors = ", ".join(f"{k}={v}" for k, v in sorted(c.errors.items())) or "0"
        lines.append(
            f"{c.strategy:<10} {c.clients:>7} {c.numbers:>8} {c.numbers_per_s:>10.1f} "
            f"{c.retries_per_number:>9.3f} {ratio:>10}  {errors:<24} {c.verdict}"
        )
    return "\n".join(lines)


def measure(
    external: str | None, rules: RuleSet, case: tuple[str, Strategy, int], clients: int, secs: float
) -> Cell:
    """One cell on its own table, and on its own DynamoDB Local unless one was given.

    DynamoDB Local's transactions slow down as it accumulates history, so a shared instance
    would penalise whichever cells run last; a fresh one per cell keeps the ratios fair.
    """
    rule = rules[RULE]
    assert isinstance(rule, SequenceRule)
    with contextlib.ExitStack() as stack:
        endpoint = external or stack.enter_context(DynamoDBLocal()).endpoint
        # One client for all threads: RETRY_CONFIG's pool of 64 keeps 16 threads from queueing.
        client = boto3.client("dynamodb", config=RETRY_CONFIG, **local_client_kwargs(endpoint))
        table = f"tally-bench-{uuid.uuid4().hex[:12]}"
        create_table(client, load_template(template_path()), "Table", table)
        stack.callback(client.delete_table, TableName=table)
        allocator = SequenceAllocator(client, table, rules)
        # Untimed warm-up: a cold JVM would otherwise slow the measurement.
        run_cell(allocator, case, 4, min(secs, 1.0))
        cell, returned = run_cell(allocator, case, clients, secs)
        verify(allocator, rule, cell, returned)
    return cell


def main(argv: list[str] | None = None) -> int:
    """Run every cell, print the table and the goal, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="window per cell")
    parser.add_argument("--clients", default="1,4,16", help="comma-separated thread counts")
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks/results/bench_writers.json")
    args = parser.parse_args(argv)
    concurrency = [int(n) for n in args.clients.split(",")]
    rules = load_rules(REPO / "src/rules.toml")

    external = endpoint_from_env()
    cells = []
    for clients in concurrency:
        for case in CELLS:
            cell = measure(external, rules, case, clients, args.seconds)
            print(f"  {cell.strategy} x{clients}: {cell.verdict}", file=sys.stderr)
            cells.append(cell)

    baseline = {c.clients: c.numbers_per_s for c in cells if c.strategy == "gapless"}
    for c in cells:
        c.vs_gapless = c.numbers_per_s / baseline[c.clients] if baseline.get(c.clients) else None
    goal = {c.clients: c.vs_gapless for c in cells if c.strategy == CELLS[-1][0]}.get(GOAL_CLIENTS)
    verdict = "n/a" if goal is None else ("PASS" if goal >= 10 else "FAIL") + f" ({goal:.2f}x)"
    print(table_text(cells))
    print(f"\nGoal: {GOAL}: {verdict}")
    failed = [f"{c.strategy} x{c.clients}" for c in cells if not c.ok]
    if failed:
        print(f"Correctness FAILED: {', '.join(failed)}")

    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "dynamodb": "external, version unknown" if external else f"DynamoDB Local {VERSION}",
        },
        "parameters": {"seconds": args.seconds, "clients": concurrency, "rule": RULE},
        "goal": {"text": GOAL, "ratio": goal, "pass": goal is not None and goal >= 10},
        "cells": [asdict(c) for c in cells],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"JSON: {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
