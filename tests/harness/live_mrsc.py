"""The live scenario on a strongly consistent (MRSC) Global Table: the project's MRSC writers
(``consistency="strong"``: the child, then its counter, never a transaction) in each of three
Regions, racing on a few posts and issue counters, and writers that crash between a like and
its count. What happened is known from outside: each crash leaves its post one behind.

- every crash's post is alerted as ``drift`` once, from the home Region, and repaired there
  (written apart: no transaction on the table, which MRSC refuses);
- no post without a crash is alerted; no other Region alerts or repairs anything;
- once the pumps ran, every post equals its children;
- no number is handed out twice (MRSC conditions see every Region's writes), and no
  transaction was sent to the table by a writer.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tally.local.stack_record import LocalStack
from tally.rules import DEFAULT_RULES_FILE, load_rules
from tally.writers import SequenceAllocator, TallyWriter
from tests.harness.live_regions import Workers, regional_client

POSTS, USERS, PROJECTS = 8, 40, 2
CRASHES = 0.08  # of the likes' counter writes: the process dies between child and count


class Crash(Exception):
    """The writer's process died after its child's write, before its counter's."""


@dataclass
class Written:
    crashed: Counter[str] = field(default_factory=Counter)  # post PK -> likes left uncounted
    likes: Counter[str] = field(default_factory=Counter)  # post PK -> likes acknowledged
    numbers: Counter[tuple[str, int]] = field(default_factory=Counter)  # (project, n) -> times
    transactions: int = 0  # TransactWriteItems / TransactGetItems a writer tried to send
    lock: threading.Lock = field(default_factory=threading.Lock)


def write(stacks: list[LocalStack], seconds: float, threads: int, seed: int) -> Written:
    rules = load_rules(DEFAULT_RULES_FILE)
    first = regional_client(stacks[0])
    for post in range(POSTS):
        first.put_item(
            TableName=stacks[0].table_name,
            Item={"PK": {"S": f"POST#{post}"}, "SK": {"S": "META"}, "likeTally": {"N": "0"}},
        )
    written = Written()
    stop = time.monotonic() + seconds

    def writer(stack: LocalStack, n: int) -> None:
        rng = random.Random(f"{seed}-{stack.region}-{n}")
        client = regional_client(stack)
        dies = threading.local()

        def counted(params: dict[str, Any], **_: Any) -> None:
            if getattr(dies, "armed", False) and params["Key"]["PK"]["S"].startswith("POST#"):
                dies.armed = False
                raise Crash()

        def transaction(**_: Any) -> None:
            with written.lock:
                written.transactions += 1

        client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", counted)
        for operation in ("TransactWriteItems", "TransactGetItems", "ExecuteTransaction"):
            client.meta.events.register(f"before-parameter-build.dynamodb.{operation}", transaction)
        tallies = TallyWriter(
            client, stack.table_name, rules, region=stack.region, consistency="strong"
        )
        numbers = SequenceAllocator(
            client, stack.table_name, rules, region=stack.region, consistency="strong"
        )
        while time.monotonic() < stop:
            post = f"POST#{rng.randrange(POSTS)}"
            like = {"PK": post, "SK": f"LIKE#USER#{rng.randrange(USERS)}"}
            dies.armed = rng.random() < CRASHES
            try:
                created = tallies.add_child(like).outcome == "created"
            except Crash:
                with written.lock:
                    written.crashed[post] += 1
                continue
            finally:
                dies.armed = False
            if created:
                with written.lock:
                    written.likes[post] += 1
            # One strategy per counter: an atomic ADD would take the number a gapless
            # writer is between its two writes for.
            strategy = "gapless" if rng.random() < 0.5 else "atomic"
            project = f"PROJECT#{strategy}-{rng.randrange(PROJECTS)}"
            got = numbers.allocate({"PK": project, "SK": "COUNTER#ISSUE"}, strategy=strategy)
            with written.lock:
                written.numbers.update((project, n) for n in got.numbers)

    workers = Workers(writer, [(stack, n) for stack in stacks for n in range(threads)])
    workers.start()
    workers.join()
    return written
