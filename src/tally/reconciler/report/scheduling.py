"""Rechecks: what is judged again later, and after how long."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tally.reconciler.protocol.lifecycle import Observed
from tally.reconciler.report.rechecks import Recheck, RecheckQueue
from tally.reconciler.stats import StatsBook
from tally.reconciler.store.watermarks import Watermarks
from tally.rules import AnyRule, Key, SequenceRule

# Why a parent is looked at again (second looks of parents that are gone, and the looks of
# a parent whose children are found through an index).
CASCADE = "orphans: waiting for a cascade"
EMPTIED = "emptied: waiting for a cascade"
INDEX_MOVED = "children found through an index: the parent moved"
INDEX_CONFIRM = "children found through an index: confirming a grace later"
AGGREGATED = "aggregated counter unbalanced"
# Rechecks an inline full audit waits out itself instead of sending them to the queue.
HELD_BY_AN_INLINE_AUDIT = frozenset({CASCADE, EMPTIED, INDEX_MOVED, INDEX_CONFIRM})


@dataclass(frozen=True)
class Settle:
    """How hard step 2 tries before it defers to a recheck."""

    attempts: int = 4
    pause_seconds: float = 0.05
    # A parent too busy to hold still is looked at again later, not hammered: a hot parent
    # would otherwise cost a full recount per retry for as long as it stays hot.
    defer_seconds: int = 30

    def pause(self, attempt: int) -> None:
        """Before another attempt: a random pause, up to twice as long each attempt."""
        time.sleep(random.uniform(0, self.pause_seconds * 2**attempt))


# A look on its way covers a change seen this long before it comes due: SQS delays are whole
# seconds, and the container that sent it and the one that sees the change read two clocks.
COVER_MARGIN_SECONDS = 1.0
# What a warm container remembers of the looks it sent, at most (then it forgets them all:
# a forgotten look only costs a look of its own).
MAX_PENDING_LOOKS = 10_000


def covers(due: float | None, now: float, margin: float = COVER_MARGIN_SECONDS) -> bool:
    """Does a look due at ``due`` (None: none on its way) read a change seen at ``now``? Only
    if it cannot have begun its reads: due more than ``margin`` from now."""
    return due is not None and due - margin > now


class PendingLooks:
    """The plain looks at aggregated counters a warm container sent and that have not come
    due, by table, rule and parent (docs/verification.md, "Asynchronous counters"):
    a change of such a parent seen before one comes due needs no look of its own. Shared by
    the container's invocations, as its open carries are; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._due: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _id(table: str, rule: str, key: Key) -> tuple[str, str, str]:
        return table, rule, json.dumps(key, sort_keys=True, default=str)

    def covering(self, table: str, rule: str, key: Key) -> bool:
        """Is a look at this parent on its way that will read what the table holds now?"""
        with self._lock:
            return covers(self._due.get(self._id(table, rule, key)), self._clock())

    def sent(self, table: str, rule: str, key: Key, delay: int) -> None:
        """A look at this parent went to the queue, due ``delay`` seconds from now."""
        now = self._clock()
        with self._lock:
            if len(self._due) >= MAX_PENDING_LOOKS:
                self._due = {k: due for k, due in self._due.items() if covers(due, now)}
                if len(self._due) >= MAX_PENDING_LOOKS:
                    self._due.clear()
            self._due[self._id(table, rule, key)] = now + delay


class Scheduler:
    """Puts rechecks on the queue, or (an inline full audit's) in ``held`` to wait out."""

    def __init__(
        self,
        queue: RecheckQueue,
        store: Watermarks,
        stats: StatsBook,
        settle: Settle,
        carry_seconds: int,
        pending: tuple[str, PendingLooks] | None = None,
    ):
        self._queue, self._store, self._stats = queue, store, stats
        self.settle, self.carry_seconds = settle, carry_seconds  # how long a recheck waits
        # Set by an inline full audit: second looks for a cascade wait in the audit.
        self.held: list[tuple[Recheck, int]] | None = None
        # The table's name and the looks at its aggregated counters on their way (None:
        # each change sends a look of its own).
        self._pending = pending

    def look_at_aggregated(self, rule: AnyRule, key: Key) -> None:
        """A plain look at a counter an aggregator keeps, a lag from now, unless one already
        on its way will read the table as it is now."""
        delay = self._delay(rule, 0)
        if self._pending is None:
            self.schedule(rule, key, 0, AGGREGATED, delay=delay)
            return
        table, looks = self._pending
        if looks.covering(table, rule.name, key):
            self._stats().coalesced += 1
            return
        self.schedule(rule, key, 0, AGGREGATED, delay=delay)
        looks.sent(table, rule.name, key, delay)  # only once it is on the queue

    def schedule(
        self,
        rule: AnyRule,
        key: Key,
        counter_seen: int,
        reason: str,
        observed: Observed | None = None,
        carry_since: int = 0,
        delay: int | None = None,
        carry_through: int = 0,
        reference: str | None = None,
        looks: int = 0,
    ) -> None:
        if delay is None:
            delay = self._delay(rule, carry_since)
        epoch = 0
        if isinstance(rule, SequenceRule) and counter_seen:
            epoch = self._store.sequence_state(rule.name, key)[1]  # the horizon's life
        recheck = Recheck(
            rule.name,
            key,
            counter_seen,
            reason,
            observed,
            carry_since,
            epoch,
            carry_through,
            reference,
            looks,
        )
        if self.held is not None and reason in HELD_BY_AN_INLINE_AUDIT:
            self.held.append((recheck, delay))  # the full audit waits them out
            return
        self.send(recheck, delay)

    def send(self, recheck: Recheck, delay: int) -> None:
        """To the queue, ``delay`` seconds from now."""
        self._queue.schedule(recheck, delay)
        self._stats().rechecks += 1

    def _delay(self, rule: AnyRule, carry_since: int) -> int:
        if isinstance(rule, SequenceRule):
            return rule.grace_seconds
        if carry_since:
            return self.carry_seconds
        return rule.lag_seconds or self.settle.defer_seconds
