"""The live index scenario's application, in a process of its own (as
tests/harness/application.py): follow edges and shopping-cart lines, written by threads
that each own their followers and carts, so what each was acknowledged is the truth.

Followers (rule "followers"): an edge ``pk = USER#<follower>``, ``sk = FOLLOWS#<slot>``
names its followee in ``GSI1PK`` and its status in ``GSI1SK`` (``FOLLOWING#…`` counts,
``BLOCKED#…`` does not). Every edge change goes through ``TallyWriter``'s index support:
one TransactWriteItems with the followee counters' updates, the edge fenced on its index
values as read, each counter (and its revision) on a profile that exists. The operations:
follow (``add_child``), unfollow (``remove_child``), re-point (``move_child`` to another
followee: -1 on one, +1 on the other), block (``FOLLOWING#`` -> ``BLOCKED#``: -1), unblock
(+1), and deleting a blocked edge (it counted for nobody: no counter).

Carts (rule "product-totals"): lines ``pk = cart#<id>``, ``sk = product#<sku>``,
``quantity``, written plainly (PutItem, UpdateItem ADD, DeleteItem) as the shopping-cart
sample does; its stream aggregator keeps ``product#<sku>/totalquantity``
(tests/harness/live_index.py).

    ready = IndexApplication.start(endpoint, table, rules_file, seed=1, followers=4, carts=2,
                                   operations=40, pause=0.1)
    acknowledged = ready.go().result()
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from tests.harness.application import Application

FOLLOWEES = [f"USER#f{n:02d}" for n in range(30)]
PRODUCTS = [f"product#p{n}" for n in range(8)]
PROFILE, TOTAL = "PROFILE", "totalquantity"
FOLLOWING, BLOCKED = "FOLLOWING#", "BLOCKED#"
FOLLOWERS_PER_THREAD, SLOTS, CARTS_PER_THREAD = 3, 3, 3

Edge = tuple[str, str]  # (followee, status prefix)


@dataclass
class Acknowledged:
    """What the application's writers were told."""

    edges: dict[str, Edge | None] = field(default_factory=dict)  # "pk/sk" -> edge or gone
    lines: dict[str, int | None] = field(default_factory=dict)  # "pk/sk" -> quantity or gone
    edge_writes: int = 0  # edge changes (each touches one or two followees' counters)
    touched: list[list[str]] = field(default_factory=list)  # per edge write, its followees
    line_writes: int = 0
    line_products: list[str] = field(default_factory=list)  # per line write, its product


def s(value: str) -> dict[str, str]:
    return {"S": value}


class Follows:
    """One process's follow-edge writes, through TallyWriter (each with its counters)."""

    def __init__(self, writer: Any, acknowledged: Acknowledged, lock: threading.Lock):
        self.writer = writer
        self.acknowledged, self.lock = acknowledged, lock
        self.stamp = 0

    def sort_value(self, status: str) -> str:
        with self.lock:
            self.stamp += 1
            return f"{status}{time.time():.6f}#{self.stamp}"

    def change(
        self,
        key: tuple[str, str],
        old: tuple[str, str] | None,  # (followee, GSI1SK) as written
        new: tuple[str, str] | None,
    ) -> tuple[str, str] | None:
        """Move one edge from ``old`` to ``new``, with its counters; returns ``new``."""
        pk, sk = key
        if old is None:
            assert new is not None
            outcome = self.writer.add_child(
                {"pk": pk, "sk": sk}, {"GSI1PK": new[0], "GSI1SK": new[1]}
            ).outcome
            expected = "created"
        elif new is None:
            outcome = self.writer.remove_child({"pk": pk, "sk": sk}).outcome
            expected = "removed"
        else:
            outcome = self.writer.move_child(
                {"pk": pk, "sk": sk}, {"GSI1PK": new[0], "GSI1SK": new[1]}
            ).outcome
            expected = "changed"
        if outcome != expected:  # each thread owns its edges: anything else is the harness's
            raise RuntimeError(f"{pk}/{sk} {old} -> {new}: {outcome}, not {expected}")
        deltas: dict[str, int] = {}
        for edge, sign in ((old, -1), (new, +1)):
            if edge is not None and edge[1].startswith(FOLLOWING):
                deltas[edge[0]] = deltas.get(edge[0], 0) + sign
        touched = [f for f, d in deltas.items() if d]
        with self.lock:
            self.acknowledged.edges[f"{pk}/{sk}"] = (
                None
                if new is None
                else (new[0], FOLLOWING if new[1].startswith(FOLLOWING) else BLOCKED)
            )
            self.acknowledged.edge_writes += 1
            self.acknowledged.touched.append(touched)
        return new

    def run(self, thread: int, seed: int, operations: int, pause: float) -> None:
        rng = random.Random(seed * 1000 + thread)
        slots: dict[tuple[str, str], tuple[str, str] | None] = {
            (f"USER#w{thread}-{j}", f"FOLLOWS#{n}"): None
            for j in range(FOLLOWERS_PER_THREAD)
            for n in range(SLOTS)
        }
        for _ in range(operations):
            key = rng.choice(sorted(slots))
            old = slots[key]
            roll = rng.random()
            if old is None:
                new: tuple[str, str] | None = (rng.choice(FOLLOWEES), self.sort_value(FOLLOWING))
            elif old[1].startswith(BLOCKED):
                new = None if roll < 0.4 else (old[0], self.sort_value(FOLLOWING))
            elif roll < 0.3:
                new = None  # unfollow
            elif roll < 0.7:  # re-point to another followee
                new = (rng.choice([f for f in FOLLOWEES if f != old[0]]), old[1])
            else:
                new = (old[0], self.sort_value(BLOCKED))
            slots[key] = self.change(key, old, new)
            time.sleep(rng.uniform(0, pause))


class Carts:
    """One process's cart-line writes, plain, as the shopping-cart sample writes them."""

    def __init__(self, client: Any, table: str, acknowledged: Acknowledged, lock: threading.Lock):
        self.client, self.table = client, table
        self.acknowledged, self.lock = acknowledged, lock

    def run(self, thread: int, seed: int, operations: int, pause: float) -> None:
        rng = random.Random(seed * 1000 + 500 + thread)
        lines: dict[tuple[str, str], int | None] = {}
        for _ in range(operations):
            pk = f"cart#w{thread}-{rng.randrange(CARTS_PER_THREAD)}"
            sk = rng.choice(PRODUCTS)
            key = {"pk": s(pk), "sk": s(sk)}
            old = lines.get((pk, sk))
            roll = rng.random()
            if old is None or roll < 0.3:
                quantity = rng.randrange(1, 6)
                self.client.put_item(
                    TableName=self.table, Item={**key, "quantity": {"N": str(quantity)}}
                )
                new: int | None = quantity
            elif roll < 0.65:
                step = rng.choice([-1, 1, 2])
                step = 1 if old + step < 1 else step
                self.client.update_item(
                    TableName=self.table,
                    Key=key,
                    UpdateExpression="ADD quantity :q",
                    ExpressionAttributeValues={":q": {"N": str(step)}},
                )
                new = old + step
            else:
                self.client.delete_item(TableName=self.table, Key=key)
                new = None
            lines[(pk, sk)] = new
            with self.lock:
                self.acknowledged.lines[f"{pk}/{sk}"] = new
                self.acknowledged.line_writes += 1
                self.acknowledged.line_products.append(sk)
            time.sleep(rng.uniform(0, pause))


def run_writers(
    client: Any,
    table: str,
    writer: Any,
    *,
    seed: int,
    followers: int,
    carts: int,
    operations: int,
    pause: float,
) -> Acknowledged:
    acknowledged, lock = Acknowledged(), threading.Lock()
    follows = Follows(writer, acknowledged, lock)
    cart_lines = Carts(client, table, acknowledged, lock)
    work: list[Callable[[], None]] = [
        (lambda t=t: follows.run(t, seed, operations, pause)) for t in range(followers)
    ]
    work += [(lambda t=t: cart_lines.run(t, seed, operations, pause)) for t in range(carts)]
    with ThreadPoolExecutor(len(work), thread_name_prefix="writer") as pool:
        for job in [pool.submit(w) for w in work]:
            job.result()
    return acknowledged


def _main(
    conn: Connection, endpoint: str, table: str, rules_file: str, options: dict[str, Any]
) -> None:
    """The application's process: connect, say ready, write on "go", send what was told."""
    try:
        import boto3
        from botocore.config import Config

        from tally.local.dynamodb_local import local_client_kwargs
        from tally.rules import load_rules
        from tally.writers import TallyWriter

        config = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=32)
        client = boto3.client("dynamodb", config=config, **local_client_kwargs(endpoint))
        client.describe_table(TableName=table)
        conn.send(("ready", None))
        conn.recv()
        writer = TallyWriter(client, table, load_rules(rules_file))
        conn.send(("done", run_writers(client, table, writer, **options)))
    except BaseException:
        conn.send(("failed", traceback.format_exc()))
    finally:
        conn.close()


class IndexApplication(Application):
    """The application's process, started and waiting for "go" (``go``, ``stop`` and the
    protocol are the live scenario's ``Application``'s; the writes and result differ)."""

    @classmethod
    def start(  # type: ignore[override]
        cls, endpoint: str, table: str, rules_file: str, **options: Any
    ) -> IndexApplication:
        return cls._spawn(_main, (endpoint, table, rules_file, options))

    def result(self) -> Acknowledged:  # type: ignore[override]
        """What the writers were told (this scenario's ``Acknowledged``), once they are done."""
        acknowledged: Acknowledged = super().result()
        return acknowledged
