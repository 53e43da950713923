"""`make demo`: a small app on the local stack, the faults real teams meet, and the catch.

Posts with likes, orders with line totals and projects with gapless issue numbers are
written by concurrent writers; then five faults are injected behind the writers' backs.
The reconciler must catch each one from the stream, alert, and repair it, and a final
audit must come back clean. Any fault left uncaught fails the demo.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console

from tally.core.dynamodb import deserialize, serialize
from tally.local import inbox, runner, stack_record, tables
from tally.local import stack as local_stack
from tally.local.functions import environ
from tally.local.pump import Pump
from tally.local.stack_record import LocalStack
from tally.rules import DEFAULT_RULES_FILE, RuleSet, load_rules
from tally.writers import SequenceAllocator, TallyWriter

POSTS, ORDERS, PROJECTS, THREADS = 12, 4, 3, 8


@dataclass
class Fault:
    """One injected fault: what was done, what must catch it, and how to see it fixed."""

    name: str
    expected_kind: str
    key: dict[str, str]
    fixed: Callable[[], bool]
    caught: str = "-"
    repair: str = "-"
    # Alerted and never repaired: ``fixed`` checks the value was kept as it was.
    kept: bool = False


DEMO_PREFIX = "tally-demo"


def run_demo(state_dir: Path, keep: bool = False) -> int:
    """The demo on a stack of its own in ``state_dir`` (resources named tally-demo-*).

    A stack the user started lives in another state directory and under other names, so
    the demo never uses or stops it; a demo stack left running by ``keep`` is replaced.
    """
    started = time.monotonic()
    local_stack.down(state_dir)
    say("starting the demo's local stack (DynamoDB Local, SNS and SQS on loopback)")
    stack = local_stack.up(state_dir, prefix=DEMO_PREFIX)
    try:
        # The demo's app is the example's: its rules, whatever RULES_FILE says.
        with environ(stack_record.env(stack) | {"RULES_FILE": str(DEFAULT_RULES_FILE)}):
            return _demo(stack, state_dir, started)
    finally:
        if keep:
            say(f"the demo's stack keeps running: TALLY_STATE_DIR={state_dir} tally <command>")
        else:
            local_stack.down(state_dir)
            say("the demo's local stack stopped")


def _demo(stack: LocalStack, state_dir: Path, started: float) -> int:
    rules = load_rules(stack_record.env(stack)["RULES_FILE"])
    ddb = stack.client("dynamodb")
    table = stack.names()["Table"]
    writer = TallyWriter(ddb, table, rules)
    numbers = SequenceAllocator(ddb, table, rules)
    pump = runner.pump(stack, state_dir)
    pump.until_idle()  # start from a quiet stream
    earlier = len(_inbox(stack, state_dir))  # alerts of earlier runs in this state directory

    say(f"writing {POSTS} posts, {ORDERS} orders, {PROJECTS} projects from {THREADS} threads")
    writes = _write_app(ddb, table, writer, numbers)
    report = pump.until_idle()
    checker_stats = f"{report.records} stream records verified in {report.batches} batches"
    alerted = len(_inbox(stack, state_dir)) - earlier
    say(f"{writes} transactional writes; {checker_stats}, {alerted} alerts")

    faults = _inject(ddb, table, rules)
    say("faults injected: " + ", ".join(f.name for f in faults))
    if not _settle(pump):
        print("DEMO FAILED: the stream and the recheck queue never went quiet")
        return 1
    alerts = _inbox(stack, state_dir)[earlier:]
    for fault in faults:
        match = [a for a in alerts if a["key"] == fault.key and a["kind"] == fault.expected_kind]
        if match:
            fault.caught, fault.repair = match[0]["kind"], match[0]["repair"]["status"]

    print("\nalerts the subscriber received:")
    _show(tables.table(tables.ALERT_COLUMNS, map(tables.alert_row, alerts)))

    audit = _final_audit()
    _show(_summary(faults))
    kept = [f.key for f in faults if f.kept]
    off = [o for o in audit.state if o.finding.key not in kept]
    clean = not off
    print(
        f"\nfinal audit: {audit.items_scanned} items, {sum(audit.parents.values())} parents, "
        f"{len(off)} findings{': clean' if clean else ''}"
        + (f" (and {len(audit.state) - len(off)} kept for a human: a text counter)" if kept else "")
    )
    missed = [f.name for f in faults if f.caught == "-" or not f.fixed()]
    print(f"demo took {time.monotonic() - started:.0f} s")
    if missed or not clean:
        print(f"DEMO FAILED: uncaught or unrepaired: {missed or 'final audit not clean'}")
        return 1
    print(
        "every injected fault was caught from the stream and alerted; each repaired, "
        "or (text in a counter) kept as it was for a human"
    )
    return 0


def _write_app(ddb: Any, table: str, writer: TallyWriter, numbers: SequenceAllocator) -> int:
    for post in range(POSTS):
        _put(ddb, table, {"PK": f"POST#demo-{post}", "SK": "META", "likeTally": 0})
    for order in range(ORDERS):
        _put(ddb, table, {"PK": f"ORDER#{order}", "SK": "META", "total": Decimal(0)})

    def client(thread: int) -> int:
        rng = random.Random(thread)
        done = 0
        for step in range(12):
            like = {
                "PK": f"POST#demo-{rng.randrange(POSTS)}",
                "SK": f"LIKE#USER#{rng.randrange(20)}",
            }
            (writer.add_child if rng.random() < 0.75 else writer.remove_child)(like)
            line = {"PK": f"ORDER#{rng.randrange(ORDERS)}", "SK": f"LINE#{thread}-{step}"}
            if step % 3 == 0:
                writer.add_child(line, {"amount": Decimal(rng.randrange(100, 10_000)) / 100})
            project = {"PK": f"PROJECT#demo-{rng.randrange(PROJECTS)}", "SK": "COUNTER#ISSUE"}
            if step % 2 == 0:
                numbers.allocate(project, strategy="gapless", attributes={"title": f"issue {step}"})
            done += 3
        return done

    with ThreadPoolExecutor(THREADS) as pool:
        return sum(pool.map(client, range(THREADS)))


def _inject(ddb: Any, table: str, rules: RuleSet) -> list[Fault]:
    def item(pk: str, sk: str) -> dict[str, Any]:
        raw = ddb.get_item(
            TableName=table, Key=serialize({"PK": pk, "SK": sk}), ConsistentRead=True
        )
        return deserialize(raw.get("Item", {}))

    def likes(post: str) -> int:
        pages = ddb.get_paginator("query").paginate(
            TableName=table,
            KeyConditionExpression="PK = :pk AND begins_with(SK, :p)",
            ExpressionAttributeValues=serialize({":pk": post, ":p": "LIKE#"}),
            ConsistentRead=True,
            Select="COUNT",
        )
        return sum(page["Count"] for page in pages)

    def consistent(post: str) -> Callable[[], bool]:
        return lambda: item(post, "META").get("likeTally") == likes(post)

    # 1. a rogue client overwrites a counter
    ddb.update_item(
        TableName=table,
        Key=serialize({"PK": "POST#demo-3", "SK": "META"}),
        UpdateExpression="SET likeTally = :v",
        ExpressionAttributeValues=serialize({":v": Decimal(999)}),
    )
    # 2. a child written without its counter bump
    _put(ddb, table, {"PK": "POST#demo-5", "SK": "LIKE#USER#rogue"})
    # 3. a client crashes between an atomic increment and its put
    crashed = {"PK": "PROJECT#demo-0", "SK": "COUNTER#ISSUE"}
    last = int(
        ddb.update_item(
            TableName=table,
            Key=serialize(crashed),
            UpdateExpression="ADD lastIssue :one",
            ExpressionAttributeValues=serialize({":one": Decimal(1)}),
            ReturnValues="UPDATED_NEW",
        )["Attributes"]["lastIssue"]["N"]
    )
    # 4. a counter reset to 0 by a rogue writer
    reset = {"PK": "PROJECT#demo-1", "SK": "COUNTER#ISSUE"}
    highest = int(item(reset["PK"], reset["SK"]).get("lastIssue", 0))
    ddb.update_item(
        TableName=table,
        Key=serialize(reset),
        UpdateExpression="SET lastIssue = :z",
        ExpressionAttributeValues=serialize({":z": Decimal(0)}),
    )
    # 5. a string written into a counter
    ddb.update_item(
        TableName=table,
        Key=serialize({"PK": "POST#demo-7", "SK": "META"}),
        UpdateExpression="SET likeTally = :s",
        ExpressionAttributeValues=serialize({":s": "12"}),
    )
    issue = rules["issue-numbers"]
    gap_key = issue.member_key(crashed, last, rules.table)  # type: ignore[union-attr]
    return [
        Fault(
            "rogue counter overwrite",
            "drift",
            {"PK": "POST#demo-3", "SK": "META"},
            consistent("POST#demo-3"),
        ),
        Fault(
            "child without counter",
            "drift",
            {"PK": "POST#demo-5", "SK": "META"},
            consistent("POST#demo-5"),
        ),
        Fault(
            "crash between increment and put",
            "gap",
            crashed,
            lambda: item(gap_key["PK"], gap_key["SK"]).get("void") is True,
        ),
        Fault(
            "counter reset to 0",
            "counter_behind",
            reset,
            lambda: int(item(reset["PK"], reset["SK"]).get("lastIssue", 0)) == highest,
        ),
        # Alerted and kept: a repair writes only over a number it has judged, so the text
        # stays for a human (it may be data the application put there by mistake).
        Fault(
            "string in a counter",
            "invalid_counter",
            {"PK": "POST#demo-7", "SK": "META"},
            lambda: item("POST#demo-7", "META").get("likeTally") == "12",
            kept=True,
        ),
    ]


def _settle(pump: Pump, deadline_seconds: float = 300) -> bool:
    """Pump until the stream is drained and every recheck has come due and run."""
    pending = pump.until_idle(max_seconds=deadline_seconds).pending_rechecks
    if pending:
        say(f"waiting for {pending} rechecks to come due (the sequences' grace period)")
    return pump.until_idle(max_seconds=deadline_seconds, rechecks=True).idle


def _final_audit() -> Any:
    from tally.audit.full_audit import full_audit
    from tally.reconciler import runtime
    from tally.reconciler.repair.policy import RepairPolicy

    reconciler = runtime.reconciler(RepairPolicy(dry_run=True))
    return full_audit(reconciler)


def _inbox(stack: LocalStack, state_dir: Path) -> list[dict[str, Any]]:
    return inbox.collect(stack.client("sqs"), stack_record.env(stack)["ALERT_INBOX_URL"], state_dir)


def _summary(faults: list[Fault]) -> Any:
    rows = []
    for fault in faults:
        fixed = ("kept" if fault.kept else "yes") if fault.fixed() else "NO"
        rows.append([fault.name, fault.caught, fault.repair, fixed])
    return tables.table(("injected fault", "caught as", "repair", "fixed"), rows)


def _put(ddb: Any, table: str, item: dict[str, Any]) -> None:
    ddb.put_item(TableName=table, Item=serialize(item))


def _show(drawn: Any) -> None:
    """A table on stdout, as wide as a terminal, or one row per line when piped."""
    Console(highlight=False, width=None if sys.stdout.isatty() else 240).print(drawn)


def say(line: str) -> None:
    print(f"demo: {line}", file=sys.stderr, flush=True)
