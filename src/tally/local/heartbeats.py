"""The HeartbeatFunction's schedule, played locally: while `tally pump` serves a multi-Region
stack, each Region's heartbeat is written through its own front (its clock, its replication)
every ``HEARTBEAT_SECONDS`` of the stack, by the same code the function runs, stamped by the
Region's clock (skewed as `tally local up --skew-ms` says)."""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from pathlib import Path

from tally.local.stack_record import LocalStack
from tally.reconciler.table.heartbeats import Heartbeat
from tally.rules import load_rules


class Beats:
    """A thread that beats every Region of ``stack`` until stopped; a Region that does not
    answer misses that beat (as a failed scheduled invocation would)."""

    def __init__(self, stack: LocalStack, rules_file: Path | str):
        if stack.replication is None:
            raise ValueError("heartbeats beat on a multi-Region stack only")
        rules = load_rules(rules_file)
        self.seconds = stack.replication.heartbeat_seconds()
        skew = stack.replication.skew_ms
        self._hearts = [
            (Heartbeat(s.client("dynamodb"), s.table_name, rules, s.region), skew.get(s.region, 0))
            for s in (stack.in_region(r) for r in stack.regions)
        ]
        self.beats = 0
        self.missed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)

    def __enter__(self) -> Beats:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            for heart, skew_ms in self._hearts:
                try:
                    heart.beat(Decimal(time.time_ns() // 1_000_000 + skew_ms) / 1000)
                    self.beats += 1
                except Exception:  # a Region not answering: this beat is missed
                    self.missed += 1
            if self._stop.wait(self.seconds):
                return
