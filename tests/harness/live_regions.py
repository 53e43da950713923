"""The live scenario on an emulated Global Table: the project's writers in every Region of a
`tally local up --regions` stack, one Region offline for a while, then every Region's pump,
and what the alerts said against what the table shows happened.

Ground truth, read once writers stopped and replication settled:
- a child lost: a child or member a Region's writer created (acknowledged) whose key now holds
  a child made in another Region: one ``overwritten`` alert expected, from that Region;
- a lost increment: a post whose counter, in its home Region, is off its children: one
  ``drift`` alert expected, from the home Region only, which repairs it (fenced): once the
  repairs replicated, every post equals its children in every Region.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import boto3

from tally.core.dynamodb import deserialize
from tally.core.regions import CHILD_ID, created_in
from tally.local.stack_record import LocalStack
from tally.rules import DEFAULT_RULES_FILE, REPAIR_MARKER, load_rules
from tally.writers import CounterBehindError, SequenceAllocator, TallyWriter

POSTS, USERS, GAPLESS_PROJECTS = 3, 25, 2
ATOMIC_PROJECT = "PROJECT#atomic"


def regional_client(stack: LocalStack) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=stack.dynamodb_endpoint,
        region_name=stack.region,
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )


@dataclass
class Written:
    """What the writers were told, by Region."""

    likes: set[tuple[str, str, str]] = field(default_factory=set)  # (region, PK, SK)
    members: set[tuple[str, str, str]] = field(default_factory=set)
    behind: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def write(
    stacks: list[LocalStack], seconds: float, threads: int, seed: int, offline: Any
) -> Written:
    """Writers in every Region for ``seconds``; ``offline(True/False)`` cuts the last Region
    off for the middle third of the run and brings it back."""
    rules = load_rules(DEFAULT_RULES_FILE)
    first = regional_client(stacks[0])
    for post in range(POSTS):
        first.put_item(
            TableName=stacks[0].table_name,
            Item={"PK": {"S": f"POST#{post}"}, "SK": {"S": "META"}, "likeTally": {"N": "0"}},
        )
    written = Written()
    started = time.monotonic()
    stop = started + seconds

    def writer(stack: LocalStack, n: int) -> None:
        rng = random.Random(f"{seed}-{stack.region}-{n}")
        dynamodb = regional_client(stack)
        tallies = TallyWriter(dynamodb, stack.table_name, rules, region=stack.region)
        numbers = SequenceAllocator(dynamodb, stack.table_name, rules, region=stack.region)
        while time.monotonic() < stop:
            like = {"PK": f"POST#{rng.randrange(POSTS)}", "SK": f"LIKE#USER#{rng.randrange(USERS)}"}
            try:
                if tallies.add_child(like).outcome == "created":
                    with written.lock:
                        written.likes.add((stack.region, like["PK"], like["SK"]))
            except Exception:  # a parent not replicated here yet: the writer's caller retries
                pass
            gapless = rng.random() < 0.7
            project = f"PROJECT#{rng.randrange(GAPLESS_PROJECTS)}" if gapless else ATOMIC_PROJECT
            try:
                got = numbers.allocate(
                    {"PK": project, "SK": "COUNTER#ISSUE"},
                    strategy="gapless" if gapless else "atomic",
                    attributes={"title": f"from {stack.region}"},
                )
            except CounterBehindError:
                with written.lock:
                    written.behind[stack.region] += 1
                continue
            with written.lock:
                written.members.update(
                    (stack.region, str(k["PK"]), str(k["SK"])) for k in got.member_keys
                )

    workers = [
        threading.Thread(target=writer, args=(stack, n)) for stack in stacks for n in range(threads)
    ]
    for w in workers:
        w.start()
    time.sleep(seconds / 3)
    offline(True)
    time.sleep(seconds / 3)
    offline(False)
    for w in workers:
        w.join()
    return written


def items(stack: LocalStack) -> dict[tuple[str, str], dict[str, Any]]:
    pages = (
        regional_client(stack)
        .get_paginator("scan")
        .paginate(TableName=stack.table_name, ConsistentRead=True)
    )
    found = (deserialize(i) for page in pages for i in page["Items"])
    return {(i["PK"], i["SK"]): i for i in found}


@dataclass
class Judged:
    expected_overwritten: set[tuple[str, str, str]]  # (losing Region, PK, SK)
    alerted_overwritten: Counter[tuple[str, str, str]]
    posts_off: set[str]
    alerted_drift: Counter[tuple[str, str]]  # (Region, post PK)
    repaired_items: int  # items carrying the reconciler's repair marker, in the home Region
    repairs_away: int  # repairs an alert from a Region other than the home one says it applied
    posts_off_after: dict[str, set[str]]  # by Region: posts still off once repairs replicated
    other_alerts: Counter[str]
    counters_behind: set[str]  # sequences whose counter is below their highest member
    alerted_behind: Counter[tuple[str, str]]  # (Region, counter PK)

    def counts(self) -> dict[str, int]:
        alerted = set(self.alerted_overwritten)
        drifted = {pk for _, pk in self.alerted_drift}
        return {
            "children lost": len(self.expected_overwritten),
            "children lost alerted": len(self.expected_overwritten & alerted),
            "false negatives (children)": len(self.expected_overwritten - alerted),
            "false positives (children)": len(alerted - self.expected_overwritten),
            "alerted twice (children)": sum(1 for c in self.alerted_overwritten.values() if c > 1),
            "posts off": len(self.posts_off),
            "false negatives (drift)": len(self.posts_off - drifted),
            "false positives (drift)": len(drifted - self.posts_off),
            "alerted twice or not from home (drift)": sum(
                c for (r, _), c in self.alerted_drift.items() if r != "us-east-1" or c > 1
            ),
            "posts repaired (items carrying the repair marker)": self.repaired_items,
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
        }


def judge(
    stacks: list[LocalStack],
    written: Written,
    held: dict[tuple[str, str], dict[str, Any]],
    alerts: list[dict[str, Any]],
    settled: Any,
) -> Judged:
    """``held``: the home Region's items once the writers stopped and replication settled,
    before any reconciler ran; ``settled()`` lets the repairs replicate before the counters
    are read again."""
    expected = set()
    for region, pk, sk in written.likes | written.members:
        now = held.get((pk, sk))
        if now is not None and created_in(now.get(CHILD_ID)) != region:
            expected.add((region, pk, sk))
    posts_off = {pk for pk in _posts() if _off(held, pk)}
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
    home = stacks[0].region
    away = 0
    for alert in alerts:
        repair = alert.get("repair")
        status = repair.get("status") if isinstance(repair, dict) else repair
        away += int(status == "applied" and alert["region"] != home)
        if alert["kind"] == "counter_behind":
            alerted_behind[(alert["region"], alert["key"]["PK"])] += 1
        elif alert["kind"] == "overwritten":
            overwritten[(alert["region"], alert["key"]["PK"], alert["key"]["SK"])] += 1
        elif alert["kind"] == "drift" and alert["key"]["PK"].startswith("POST#"):
            drift[(alert["region"], alert["key"]["PK"])] += 1
        else:
            other[f"{alert['kind']} in {alert['region']}"] += 1
    settled()
    after = {s.region: {pk for pk in _posts() if _off(items(s), pk)} for s in stacks}
    repaired = sum(1 for i in items(stacks[0]).values() if REPAIR_MARKER in i)
    return Judged(
        expected,
        overwritten,
        posts_off,
        drift,
        repaired,
        away,
        after,
        other,
        behind,
        alerted_behind,
    )


def _posts() -> list[str]:
    return [f"POST#{post}" for post in range(POSTS)]


def _off(held: dict[tuple[str, str], dict[str, Any]], pk: str) -> bool:
    children = sum(1 for k in held if k[0] == pk and k[1].startswith("LIKE#"))
    return bool(held[(pk, "META")]["likeTally"] != children)
