"""The live scenario on an emulated Global Table: the project's writers in every Region of a
`tally local up --regions` stack (likes, order lines, issue numbers by every strategy:
gapless, atomic, sortkey, block) and beside them a team's own seed-style writers, adopted as
docs/adopting.md shows (``tests.harness.seed_writers``: seed 004's like transaction on the same
posts and users, seed 003's optimistic locking on a project of its own), their clients losing
responses after commit and throttled, one Region offline for a while, then every Region's
pump, and what the alerts said against what the table shows happened.

Ground truth, read once writers stopped and replication settled:
- a child lost: a child or member a Region's writer created (acknowledged) whose key now holds
  a child made in another Region: one ``overwritten`` alert expected, from that Region, and
  none for any other child (the reconciler never writes a child, so this holds whether the
  pumps ran during the writes or after). The seed writers' children are judged by the id
  each was created with: seed 003's put is unconditional, so a Region whose counter went back
  (another Region's older count won) can hand a number out again and replace a member of its
  own; that member is lost too, and counted (``lost to their own Region``);
- a lost increment: a post or order whose counter, in its home Region, is off its children
  once replication settled, before any reconciler ran: one ``drift`` alert expected, from the
  home Region only. Posts (``auto``) are repaired, fenced: once the repairs replicated, every
  post equals its children in every Region. Orders (``alert``) stay as they are.

With the pumps running during the writes (``live``), a post can drift, be repaired and drift
again, so the drift ground truth is the end state: every post equal to its children in every
Region, every drift alert from the home Region, no repair outside it.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from statistics import median, quantiles
from typing import Any

import boto3
from botocore.config import Config

from tally.core.dynamodb import deserialize
from tally.core.regions import CHILD_ID, created_in
from tally.local.stack_record import LocalStack
from tally.rules import DEFAULT_RULES_FILE, REPAIR_MARKER, load_rules
from tally.writers import CounterBehindError, SequenceAllocator, TallyWriter
from tests.harness import seed_writers
from tests.harness.faults import Faults

POSTS, USERS, ORDERS, LINES, GAPLESS_PROJECTS = 3, 25, 2, 12, 2
ATOMIC_PROJECT, SORTKEY_PROJECT = "PROJECT#atomic", "PROJECT#sortkey"
BLOCK_PROJECT = "PROJECT#block"
SEED_PROJECT = "PROJECT#seed003"  # seed 003's optimistic locking, a team's own writer
# Per attempt, on the writers' writes: a response lost after commit, a throttled attempt.
LOST, THROTTLED = 0.03, 0.03


def regional_client(stack: LocalStack, retries: int | None = None) -> Any:
    config = Config(retries={"mode": "standard", "max_attempts": retries}) if retries else None
    return boto3.client(
        "dynamodb",
        endpoint_url=stack.dynamodb_endpoint,
        region_name=stack.region,
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=config,
    )


@dataclass
class Written:
    """What the writers were told, by Region, and when."""

    children: set[tuple[str, str, str]] = field(default_factory=set)  # (region, PK, SK)
    acknowledged: dict[tuple[str, str, str], float] = field(default_factory=dict)  # epoch s
    # The seed writers' children: the ids each was created with, and every child's writer.
    ids: dict[tuple[str, str, str], set[str]] = field(default_factory=dict)
    writer: dict[tuple[str, str, str], str] = field(default_factory=dict)
    kinds: Counter[str] = field(default_factory=Counter)  # acknowledged creations by writer
    behind: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    stopped: float = 0.0  # epoch seconds the last writer stopped
    lock: threading.Lock = field(default_factory=threading.Lock)

    def created(
        self, region: str, pk: str, sk: str, kind: str, child_id: str | None = None
    ) -> None:
        with self.lock:
            self.children.add((region, pk, sk))
            self.acknowledged[(region, pk, sk)] = time.time()
            self.writer[(region, pk, sk)] = kind
            self.kinds[kind] += 1
            if child_id is not None:
                self.ids.setdefault((region, pk, sk), set()).add(child_id)


class Workers:
    """Writer threads, one per argument tuple; ``join`` raises the first one's failure, so a
    writer that dies fails the run instead of leaving a warning."""

    def __init__(self, target: Any, arguments: list[tuple[Any, ...]]):
        self.failed: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, args=(target, *a)) for a in arguments]

    def _run(self, target: Any, *arguments: Any) -> None:
        try:
            target(*arguments)
        except BaseException as error:
            self.failed.append(error)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()
        if self.failed:
            raise self.failed[0]


def write(
    stacks: list[LocalStack], seconds: float, threads: int, seed: int, offline: Any
) -> Written:
    """Writers in every Region for ``seconds``, their responses lost and throttled at times;
    ``offline(True/False)`` cuts the last Region off for the middle third of the run and
    brings it back."""
    rules = load_rules(DEFAULT_RULES_FILE)
    first = regional_client(stacks[0])
    parents = [(f"POST#{p}", "likeTally") for p in range(POSTS)]
    parents += [(f"ORDER#{o}", "total") for o in range(ORDERS)]
    for pk, counter in parents:
        first.put_item(
            TableName=stacks[0].table_name,
            Item={"PK": {"S": pk}, "SK": {"S": "META"}, counter: {"N": "0"}},
        )
    seeded = {"PK": {"S": SEED_PROJECT}, "SK": {"S": "COUNTER#ISSUE"}}
    first.put_item(TableName=stacks[0].table_name, Item={**seeded, "lastIssue": {"N": "0"}})
    written = Written()
    stop = time.monotonic() + seconds
    clients = {s.region: regional_client(s, retries=8) for s in stacks}

    def writer(stack: LocalStack, n: int) -> None:
        rng = random.Random(f"{seed}-{stack.region}-{n}")
        dynamodb = clients[stack.region]
        tallies = TallyWriter(dynamodb, stack.table_name, rules, region=stack.region)
        numbers = SequenceAllocator(dynamodb, stack.table_name, rules, region=stack.region)
        while time.monotonic() < stop:
            if rng.random() < 0.7:
                key = {
                    "PK": f"POST#{rng.randrange(POSTS)}",
                    "SK": f"LIKE#USER#{rng.randrange(USERS)}",
                }
                amount = None
            else:
                key = {"PK": f"ORDER#{rng.randrange(ORDERS)}", "SK": f"LINE#{rng.randrange(LINES)}"}
                amount = {"amount": Decimal(rng.randrange(1, 100)) / 4}
            try:
                if tallies.add_child(key, amount).outcome == "created":
                    kind = "likes" if amount is None else "order lines"
                    written.created(stack.region, key["PK"], key["SK"], kind)
            except Exception:  # a parent not replicated here yet: the writer's caller retries
                pass
            draw = rng.random()
            strategy = (
                "gapless"
                if draw < 0.45
                else "atomic"
                if draw < 0.65
                else "sortkey"
                if draw < 0.85
                else "block"
            )
            project = {
                "gapless": f"PROJECT#{rng.randrange(GAPLESS_PROJECTS)}",
                "atomic": ATOMIC_PROJECT,
                "sortkey": SORTKEY_PROJECT,
                "block": BLOCK_PROJECT,
            }[strategy]
            try:
                got = numbers.allocate(
                    {"PK": project, "SK": "COUNTER#ISSUE"},
                    strategy=strategy,  # type: ignore[arg-type]
                    count=2 if strategy == "block" else 1,
                    attributes={"title": f"from {stack.region}"},
                )
            except CounterBehindError:
                with written.lock:
                    written.behind[stack.region] += 1
                continue
            for member in got.member_keys:
                written.created(stack.region, str(member["PK"]), str(member["SK"]), "numbers")

    def seed_writer(stack: LocalStack) -> None:
        """A team's own writers in this Region, one call at a time: seed 004's like on the
        project's posts and users (the same keys as the project's writers, so a seed like and
        a project like race for one key, and both stamp one post), seed 003's allocator on
        its own project. Like any app, they start once the posts and the counter they write
        are there (created in the first Region, replicated)."""
        rng = random.Random(f"{seed}-{stack.region}-seeds")
        dynamodb, table = clients[stack.region], stack.table_name
        needed = [{"PK": {"S": pk}, "SK": {"S": "META"}} for pk, _ in parents] + [seeded]
        while time.monotonic() < stop and not all(
            "Item" in dynamodb.get_item(TableName=table, Key=k, ConsistentRead=True) for k in needed
        ):
            time.sleep(0.05)
        while time.monotonic() < stop:
            if rng.random() < 0.5:
                post, user = f"POST#{rng.randrange(POSTS)}", str(rng.randrange(USERS))
                child_id = seed_writers.like(dynamodb, table, stack.region, post, user)
                if child_id is not None:
                    sk = f"LIKE#USER#{user}"
                    written.created(stack.region, post, sk, "seed 004 likes", child_id)
            else:
                sk, child_id = seed_writers.take_issue(dynamodb, table, stack.region, SEED_PROJECT)
                written.created(stack.region, SEED_PROJECT, sk, "seed 003 numbers", child_id)

    workers = Workers(
        lambda stack, n: seed_writer(stack) if n == threads else writer(stack, n),
        [(stack, n) for stack in stacks for n in range(threads + 1)],
    )
    with contextlib.ExitStack() as faulty:
        injectors = {
            region: faulty.enter_context(
                Faults(
                    client,
                    lost=LOST,
                    throttled=THROTTLED,
                    seed=seed + i,
                    operations={"TransactWriteItems", "UpdateItem", "PutItem"},
                )
            )
            for i, (region, client) in enumerate(clients.items())
        }
        workers.start()
        time.sleep(seconds / 3)
        offline(True)
        time.sleep(seconds / 3)
        offline(False)
        workers.join()
    written.stopped = time.time()
    for injector in injectors.values():
        for stats in injector.stats.values():
            written.faults["responses lost after commit"] += stats.lost
            written.faults["throttled"] += stats.throttled
    return written


def items(stack: LocalStack) -> dict[tuple[str, str], dict[str, Any]]:
    pages = (
        regional_client(stack)
        .get_paginator("scan")
        .paginate(TableName=stack.table_name, ConsistentRead=True)
    )
    found = (deserialize(i) for page in pages for i in page["Items"])
    return {(i["PK"], i["SK"]): i for i in found}


def _epoch(detected_at: str) -> float:
    return datetime.fromisoformat(detected_at.replace("Z", "+00:00")).timestamp()


@dataclass
class Judged:
    # (losing Region, PK, SK): how many of that Region's children under the key were lost
    # (more than one only for seed 003's, which can replace a child of its own Region's)
    expected_overwritten: Counter[tuple[str, str, str]]
    alerted_overwritten: Counter[tuple[str, str, str]]
    parents_off: set[str]  # posts and orders off once settled, before any reconciler ran
    alerted_drift: Counter[tuple[str, str]]  # (Region, parent PK)
    repaired_items: int  # items carrying the reconciler's repair marker, in the home Region
    repairs_away: int  # repairs an alert from a Region other than the home one says it applied
    posts_off_after: dict[str, set[str]]  # by Region: posts still off once repairs replicated
    other_alerts: Counter[str]
    counters_behind: set[str]  # sequences whose counter is below their highest member
    alerted_behind: Counter[tuple[str, str]]  # (Region, counter PK)
    latency: dict[str, list[float]]  # by kind: seconds from the fault to its alert
    live: bool = False
    lost_by_writer: Counter[str] = field(default_factory=Counter)  # children lost, by writer
    lost_to_own_region: int = 0  # seed children a later child of their own Region replaced
    gaps: int = 0  # numbers alerted as gaps (alert-only on a Global Table)
    false_gaps: int = 0  # of those, numbers whose member the settled table holds

    def counts(self) -> dict[str, int]:
        expected, alerted = self.expected_overwritten, self.alerted_overwritten
        drifted = {pk for _, pk in self.alerted_drift}
        posts_off = {pk for pk in self.parents_off if pk.startswith("POST#")}
        orders_off = self.parents_off - posts_off
        alerted_orders = {pk for pk in drifted if pk.startswith("ORDER#")}
        counts = {
            "children lost": sum(expected.values()),
            "children lost alerted": sum((expected & alerted).values()),
            "children lost to their own Region (seed 003's unconditional put)": (
                self.lost_to_own_region
            ),
            "false negatives (children)": sum((expected - alerted).values()),
            "false positives (children)": sum(c for k, c in alerted.items() if k not in expected),
            "alerted twice (children)": sum(
                1 for k, c in alerted.items() if c > max(expected[k], 1)
            ),
            "posts off": len(posts_off),
            "orders off": len(orders_off),
            "drift alerted outside home": sum(
                c for (r, _), c in self.alerted_drift.items() if r != "us-east-1"
            ),
            "repairs applied outside the home Region": self.repairs_away,
            "posts still off after settle, any Region": sum(
                len(p) for p in self.posts_off_after.values()
            ),
            "counters behind": len(self.counters_behind),
            "false negatives (counter behind)": len(
                self.counters_behind - {pk for _, pk in self.alerted_behind}
            ),
            "counter behind alerted outside home": sum(
                c for (r, _), c in self.alerted_behind.items() if r != "us-east-1"
            ),
            "numbers alerted as gaps": self.gaps,
            "false positives (gaps: the member is there)": self.false_gaps,
        }
        if not self.live:  # the ground truth of a run judged once settled
            counts |= {
                "false negatives (drift)": len((posts_off | orders_off) - drifted),
                "false positives (drift)": len(drifted - posts_off - orders_off),
                "alerted twice (drift)": sum(1 for c in self.alerted_drift.values() if c > 1),
                "posts repaired (items carrying the repair marker)": self.repaired_items,
                "orders alerted, not repaired": len(alerted_orders & orders_off),
            }
        return counts

    def missed(self) -> list[str]:
        """The children lost and not alerted (as often as lost), for the printed line."""
        short = self.expected_overwritten - self.alerted_overwritten
        return [f"{r} {pk} {sk} x{n}" for (r, pk, sk), n in sorted(short.items())]

    def latencies(self) -> dict[str, str]:
        """By kind: how many alerts, and the median and 95th percentile seconds to alert."""
        shown = {}
        for kind, seconds in sorted(self.latency.items()):
            p95 = quantiles(seconds, n=20)[-1] if len(seconds) > 1 else seconds[0]
            shown[kind] = f"{len(seconds)} alerts, median {median(seconds):.1f} s, p95 {p95:.1f} s"
        return shown


def judge(
    stacks: list[LocalStack],
    written: Written,
    held: dict[tuple[str, str], dict[str, Any]],
    alerts: list[dict[str, Any]],
    settled: Any,
    *,
    live: bool = False,
) -> Judged:
    """``held``: the home Region's items once the writers stopped and replication settled
    (before any reconciler ran, unless ``live``); ``settled()`` lets the repairs replicate
    before the counters are read again."""
    expected, lost_by_writer, lost_at_home = Counter[tuple[str, str, str]](), Counter[str](), 0
    for region, pk, sk in written.children:
        now = held.get((pk, sk))
        ids = written.ids.get((region, pk, sk), set())
        held_id = now.get(CHILD_ID) if now is not None else None
        # A seed child can be replaced by a later one of its own Region's (seed 003's put
        # has no condition): each one but the last was lost to its own Region.
        if now is not None and created_in(held_id) != region:
            lost, at_home = max(len(ids), 1), max(len(ids) - 1, 0)
        else:
            lost = at_home = len(ids - {held_id})
        lost_at_home += at_home
        if lost:
            expected[(region, pk, sk)] = lost
            lost_by_writer[written.writer[(region, pk, sk)]] += lost
    parents_off = {pk for pk in _parents() if _off(held, pk)}
    behind = set()
    for (pk, sk), counter in held.items():
        if sk == "COUNTER#ISSUE":
            numbers = [int(m[1].split("#")[1]) for m in held if m[0] == pk and m[1] != sk]
            if numbers and counter.get("lastIssue", 0) < max(numbers):
                behind.add(pk)
    overwritten: Counter[tuple[str, str, str]] = Counter()
    drift: Counter[tuple[str, str]] = Counter()
    alerted_behind: Counter[tuple[str, str]] = Counter()
    other: Counter[str] = Counter()
    latency: dict[str, list[float]] = {}
    home = stacks[0].region
    away = gaps = false_gaps = 0
    for alert in alerts:
        repair = alert.get("repair")
        status = repair.get("status") if isinstance(repair, dict) else repair
        away += int(status == "applied" and alert["region"] != home)
        key = alert["key"]
        if alert["kind"] == "counter_behind":
            alerted_behind[(alert["region"], key["PK"])] += 1
        elif alert["kind"] == "overwritten":
            overwritten[(alert["region"], key["PK"], key["SK"])] += 1
            acked = written.acknowledged.get((alert["region"], key["PK"], key["SK"]))
            if acked is not None:
                latency.setdefault("overwritten", []).append(_epoch(alert["detected_at"]) - acked)
        elif alert["kind"] == "gap":
            # Seed 003 leaves true gaps (a lost answer to its fenced ADD, then another
            # number); a gap whose member the settled table holds was alerted falsely.
            low = int(alert["number"])
            numbers = range(low, int(alert.get("through") or low) + 1)
            gaps += len(numbers)
            false_gaps += sum((key["PK"], f"ISSUE#{n:010d}") in held for n in numbers)
            other[f"gap in {alert['region']}"] += 1
        elif alert["kind"] == "drift" and key["PK"].startswith(("POST#", "ORDER#")):
            drift[(alert["region"], key["PK"])] += 1
            latency.setdefault("drift, from the writers' stop", []).append(
                _epoch(alert["detected_at"]) - written.stopped
            )
        else:
            other[f"{alert['kind']} in {alert['region']}"] += 1
    settled()
    after = {s.region: {p for p in _parents("POST#") if _off(items(s), p)} for s in stacks}
    repaired = sum(1 for i in items(stacks[0]).values() if REPAIR_MARKER in i)
    return Judged(
        expected,
        overwritten,
        parents_off,
        drift,
        repaired,
        away,
        after,
        other,
        behind,
        alerted_behind,
        latency,
        live,
        lost_by_writer,
        lost_at_home,
        gaps,
        false_gaps,
    )


def _parents(prefix: str = "") -> list[str]:
    every = [f"POST#{post}" for post in range(POSTS)] + [f"ORDER#{o}" for o in range(ORDERS)]
    return [pk for pk in every if pk.startswith(prefix)]


def _off(held: dict[tuple[str, str], dict[str, Any]], pk: str) -> bool:
    if pk.startswith("POST#"):
        truth = Decimal(sum(1 for k in held if k[0] == pk and k[1].startswith("LIKE#")))
        return bool(held[(pk, "META")]["likeTally"] != truth)
    lines = (i.get("amount", 0) for k, i in held.items() if k[0] == pk and k[1].startswith("LINE#"))
    return bool(held[(pk, "META")]["total"] != sum(lines, Decimal(0)))
