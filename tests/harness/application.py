"""The live scenario's application: writer threads in a process of their own, as in
production, where the application writes from other machines than the reconciler's.

They share no interpreter with the pump and the handlers, so the fault -> alert latency the
live test measures includes no wait for the handlers' interpreter lock caused by the
writers (the machine's cores are still shared).

    ready = Application.start(endpoint, table, rules_file, seed=1, writers=6, operations=30)
    ...  # the pump runs, the injector is ready
    ledger = ready.go().result()  # what each writer was acknowledged

Each writer owns its own children, so its acknowledgements are the truth the run is judged
against: which likes are present, which order lines were added, how many numbers were
handed out.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from multiprocessing.connection import Connection
from typing import Any, Self

POSTS = [f"POST#live{n}" for n in range(10)]
HOT = "POST#hot"
LIVE_ORDER = "ORDER#live"
PROJECT = "PROJECT#live"
# How long the parent waits for the process to import and connect, and then for its writes.
START_SECONDS, WRITE_SECONDS = 120, 600


@dataclass
class Acknowledged:
    """What the application's writers were told."""

    likes: dict[str, bool] = field(default_factory=dict)  # "PK/SK" -> present
    lines: dict[str, Decimal] = field(default_factory=dict)  # LINE# sort key -> amount
    numbers: int = 0  # numbers handed out on PROJECT


class Writers:
    """The writer threads' work, in the application's process."""

    def __init__(self, tallies: Any, numbers: Any, seed: int, operations: int):
        self.tallies, self.numbers = tallies, numbers
        self.seed, self.operations = seed, operations
        self.acknowledged = Acknowledged()
        self.lock = threading.Lock()

    def write(self, thread: int) -> None:
        """One writer thread: likes on the small posts, order lines, issue numbers."""
        rng = random.Random(self.seed * 100 + thread)
        for op in range(self.operations):
            roll = rng.random()
            if roll < 0.7:
                key = {"PK": rng.choice(POSTS), "SK": f"LIKE#T{thread}#{rng.randrange(6)}"}
                self.like(key, rng.random() < 0.65)
            elif roll < 0.85:
                key = {"PK": LIVE_ORDER, "SK": f"LINE#T{thread}#{op}"}
                amount = Decimal(rng.randrange(1, 500)) / 100
                self.tallies.add_child(key, {"amount": amount})
                with self.lock:
                    self.acknowledged.lines[key["SK"]] = amount
            else:
                self.numbers.allocate({"PK": PROJECT, "SK": "COUNTER#ISSUE"}, strategy="gapless")
                with self.lock:
                    self.acknowledged.numbers += 1

    def write_hot(self) -> None:
        """Likes and unlikes on the hot post, by a writer of its own."""
        rng = random.Random(self.seed)
        for _ in range(self.operations):
            self.like({"PK": HOT, "SK": f"LIKE#HOT#{rng.randrange(20)}"}, rng.random() < 0.6)

    def like(self, key: dict[str, str], add: bool) -> None:
        if add:
            outcome = self.tallies.add_child(key).outcome
            present = outcome in ("created", "already_present")
        else:
            outcome = self.tallies.remove_child(key).outcome
            present = outcome not in ("removed", "not_present")
        with self.lock:
            self.acknowledged.likes[f"{key['PK']}/{key['SK']}"] = present

    def run(self, threads: int) -> Acknowledged:
        with ThreadPoolExecutor(threads + 1, thread_name_prefix="writer") as pool:
            jobs = [pool.submit(self.write, t) for t in range(threads)]
            jobs.append(pool.submit(self.write_hot))
            for job in jobs:
                job.result()
        return self.acknowledged


def _main(
    conn: Connection,
    endpoint: str,
    table: str,
    rules_file: str | None,
    seed: int,
    threads: int,
    operations: int,
) -> None:
    """The application's process: connect, say ready, write on "go", send what was told."""
    try:
        import boto3

        from tally.local.dynamodb_local import local_client_kwargs
        from tally.rules import load_rules
        from tally.writers import SequenceAllocator, TallyWriter

        rules = load_rules(rules_file)
        client = boto3.client("dynamodb", **local_client_kwargs(endpoint))
        writers = Writers(
            TallyWriter(client, table, rules),
            SequenceAllocator(client, table, rules),
            seed,
            operations,
        )
        conn.send(("ready", None))
        conn.recv()
        conn.send(("done", writers.run(threads)))
    except BaseException:
        conn.send(("failed", traceback.format_exc()))
    finally:
        conn.close()


class Application:
    """The application's process, started and waiting for "go"."""

    def __init__(self, process: Any, conn: Connection):
        self.process, self.conn = process, conn

    @classmethod
    def start(
        cls,
        endpoint: str,
        table: str,
        rules_file: str | None,
        *,
        seed: int,
        writers: int,
        operations: int,
    ) -> Application:
        """Start the process (a fresh interpreter: no lock or client is inherited) and
        wait until it is connected and ready to write."""
        return cls._spawn(_main, (endpoint, table, rules_file, seed, writers, operations))

    @classmethod
    def _spawn(cls, main: Callable[..., None], args: tuple[Any, ...]) -> Self:
        """Run ``main(conn, *args)`` in a fresh interpreter; wait until it says "ready"."""
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(
            target=main, args=(theirs, *args), name="application", daemon=True
        )
        process.start()
        theirs.close()
        application = cls(process, ours)
        application._receive("ready", START_SECONDS)
        return application

    def go(self) -> Application:
        self.conn.send("go")
        return self

    def result(self) -> Acknowledged:
        """What the writers were told, once they are done."""
        try:
            return self._receive("done", WRITE_SECONDS)
        finally:
            self.conn.close()
            self.process.join(timeout=30)

    def stop(self) -> None:
        """End the process if it still runs (a run that failed before its result)."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=30)

    def _receive(self, expected: str, seconds: float) -> Any:
        if not self.conn.poll(seconds):
            self.stop()
            raise RuntimeError(f"the application's process did not say {expected!r} in {seconds} s")
        try:
            what, value = self.conn.recv()
        except EOFError:
            raise RuntimeError(
                f"the application's process ended (exit code {self.process.exitcode})"
            ) from None
        if what == "failed":
            raise RuntimeError(f"the application's process failed:\n{value}")
        if what != expected:
            raise RuntimeError(f"the application's process said {what!r}, not {expected!r}")
        return value
