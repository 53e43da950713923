"""Writers in several emulated Regions of one Global Table, racing: what last-writer-wins does
to the project's own writers (a measurement, not a test; issue 37's starting point).

    python -m tests.harness.global_race --regions 2 --seconds 20 --lag-ms 1000 [--json F]

Each Region runs threads of ``TallyWriter`` likes and ``SequenceAllocator`` (gapless)
allocations on the same few posts and projects, through that Region's front. Once the writers
stop and replication settles it counts, from what the writers were told and what every
Region holds: numbers handed out twice, acknowledged likes overwritten by another Region's
write of the same child, increments lost (a counter below its children), and whether every
Region holds the same items.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tally.core.streams import StreamReader
from tally.local.dynamodb_local import DynamoDBLocal
from tally.local.replication.emulator import Emulator, Settings
from tally.local.replication.replicator import Lag
from tally.local.template import create_table, load_template, template_path
from tally.reconciler.protocol.regions import own_loss, still_lost
from tally.rules import DEFAULT_RULES_FILE, load_rules
from tally.writers import CounterBehindError, SequenceAllocator, TallyWriter
from tests.harness.regions import AP, EU, US, client, plain

POSTS, PROJECTS, USERS = 3, 2, 40


def race(
    regions: list[str], seconds: float, lag_ms: float, threads: int, seed: int
) -> dict[str, Any]:
    databases = [DynamoDBLocal() for _ in regions]
    with ThreadPoolExecutor(len(regions)) as pool:
        list(pool.map(lambda d: d.start(), databases))
    table = "race"
    emulator = Emulator(
        Settings(
            {r: d.endpoint for r, d in zip(regions, databases, strict=True)},
            [table],
            lag=Lag(lag_ms, lag_ms * 3),
            seed=seed,
        )
    ).start()
    try:
        return _race(emulator, regions, table, seconds, threads, seed)
    finally:
        emulator.stop()
        for d in databases:
            d.stop()


def _race(
    emulator: Emulator, regions: list[str], table: str, seconds: float, threads: int, seed: int
) -> dict[str, Any]:
    rules = load_rules(DEFAULT_RULES_FILE)
    clients = {r: client("dynamodb", emulator.endpoint(r), r) for r in regions}
    for dynamodb in clients.values():
        create_table(dynamodb, load_template(template_path()), "Table", table)
    first = clients[regions[0]]
    for post in range(POSTS):
        first.put_item(
            TableName=table,
            Item={"PK": {"S": f"POST#{post}"}, "SK": {"S": "META"}, "likeTally": {"N": "0"}},
        )
    emulator.settle()

    likes: list[tuple[str, str, str]] = []  # (region, post, like SK) acknowledged as added
    numbers: list[tuple[str, str, int]] = []  # (region, project, number) handed out
    behind: Counter[str] = Counter()
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def writer(region: str, n: int) -> None:
        rng = random.Random(f"{seed}-{region}-{n}")
        tallies = TallyWriter(clients[region], table, rules, region=region)
        sequences = SequenceAllocator(clients[region], table, rules, region=region)
        while time.monotonic() < stop:
            post = f"POST#{rng.randrange(POSTS)}"
            like = {"PK": post, "SK": f"LIKE#USER#{rng.randrange(USERS)}"}
            result = tallies.add_child(like, {"by": region})
            if result.outcome == "created":
                with lock:
                    likes.append((region, post, like["SK"]))
            project = {"PK": f"PROJECT#{rng.randrange(PROJECTS)}", "SK": "COUNTER#ISSUE"}
            try:
                got = sequences.allocate(project, strategy="gapless", attributes={"by": region})
            except CounterBehindError:
                with lock:
                    behind[region] += 1
                continue
            with lock:
                numbers.extend((region, project["PK"], n) for n in got.numbers)

    workers = [
        threading.Thread(target=writer, args=(r, n)) for r in regions for n in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    settle_started = time.monotonic()
    emulator.settle(timeout=300)
    settled_in = time.monotonic() - settle_started

    held = {r: _items(clients[r], table) for r in regions}
    same = all(held[r] == held[regions[0]] for r in regions)
    items = {(i["PK"], i["SK"]): i for i in held[regions[0]]}
    twice = Counter((p, n) for _, p, n in numbers)
    overwritten = [
        (r, p, sk) for r, p, sk in likes if items.get((p, sk), {}).get("by") not in (None, r)
    ]
    lost = 0
    for post in range(POSTS):
        children = sum(1 for pk, sk in items if pk == f"POST#{post}" and sk.startswith("LIKE#"))
        lost += children - int(items[(f"POST#{post}", "META")]["likeTally"])
    status = emulator.status()
    found = _losses_found(emulator, clients, regions, table, held)
    truth_members = sum(c - 1 for c in twice.values() if c > 1)
    return {
        "regions": regions,
        "seconds": seconds,
        "lag_ms": emulator.settings.lag.median_ms if emulator.settings.lag else None,
        "likes_acknowledged": len(likes),
        "likes_overwritten": len(overwritten),
        "numbers_handed_out": len(numbers),
        "numbers_handed_out_twice": sum(1 for c in twice.values() if c > 1),
        "counter_behind_errors": sum(behind.values()),
        "increments_lost": lost,
        "regions_hold_the_same_items": same,
        "settled_in_s": round(settled_in, 2),
        "versions_lost_in_replication": sum(v["lost"] for v in status["links"].values()),
        "versions_applied_in_replication": sum(v["applied"] for v in status["links"].values()),
        "members_lost (truth)": truth_members,
        "members_lost found from the losers' streams": found["members"],
        "likes_lost found from the losers' streams": found["likes"],
        "losses found twice": found["twice"],
        "increments_lost found (provisional, by Region)": found["increments"],
    }


def _losses_found(
    emulator: Emulator,
    clients: dict[str, Any],
    regions: list[str],
    table: str,
    held: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Each Region reads its own stream (through its front, as the reconciler would) for
    losses of its own writes, judged again against what it holds once settled."""
    seen: Counter[tuple[str, str, str | None]] = Counter()
    increments: Counter[str] = Counter()
    for region in regions:
        streams = client("dynamodbstreams", emulator.endpoint(region), region)
        arn = clients[region].describe_table(TableName=table)["Table"]["LatestStreamArn"]
        now = {(i["PK"], i["SK"]): i for i in held[region]}
        for record in StreamReader(streams, arn, region).drain(limit=1000, idle_polls=1):
            images = record["dynamodb"]
            old = plain(images["OldImage"]) if "OldImage" in images else None
            new = plain(images["NewImage"]) if "NewImage" in images else None
            key = plain(images["Keys"])
            loss = own_loss(record["eventName"], key, old, new, region)
            if loss is None:
                continue
            if loss.kind == "increments_lost":
                increments[region] += int(loss.writes)
            elif still_lost(loss, now.get((key["PK"], key["SK"]))):
                seen[(key["PK"], key["SK"], loss.child_id)] += 1
    return {
        "members": sum(1 for (pk, _, _) in seen if pk.startswith("PROJECT#")),
        "likes": sum(1 for (pk, _, _) in seen if pk.startswith("POST#")),
        "twice": sum(1 for c in seen.values() if c > 1),
        "increments": dict(increments),
    }


def _items(dynamodb: Any, table: str) -> list[dict[str, Any]]:
    pages = dynamodb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    return sorted(
        (plain(i) for page in pages for i in page["Items"]), key=lambda i: (i["PK"], i["SK"])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regions", type=int, choices=(2, 3), default=2)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--lag-ms", type=float, default=1000)
    parser.add_argument("--threads", type=int, default=3, help="writer threads per Region")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args(argv)
    found = race(
        [US, EU, AP][: options.regions],
        options.seconds,
        options.lag_ms,
        options.threads,
        options.seed,
    )
    table = Table("measure", "value", title="writers racing in several Regions")
    for name, value in found.items():
        table.add_row(name.replace("_", " "), str(value))
    Console().print(table)
    if options.json:
        options.json.write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
