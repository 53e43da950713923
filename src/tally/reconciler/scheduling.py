"""Rechecks: what is judged again later, and after how long."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from tally.reconciler.audit_watermarks import AuditWatermarks
from tally.reconciler.protocol.lifecycle import Observed
from tally.reconciler.rechecks import Recheck, RecheckQueue
from tally.reconciler.stats import StatsBook
from tally.rules import AnyRule, Key, SequenceRule

# Why a parent is looked at again (second looks of parents that are gone, and the looks of
# a parent whose children are found through an index).
CASCADE = "orphans: waiting for a cascade"
EMPTIED = "emptied: waiting for a cascade"
INDEX_MOVED = "children found through an index: the parent moved"
INDEX_CONFIRM = "children found through an index: confirming a grace later"
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


class Scheduler:
    """Puts rechecks on the queue, or (an inline full audit's) in ``held`` to wait out."""

    def __init__(
        self,
        queue: RecheckQueue,
        store: AuditWatermarks,
        stats: StatsBook,
        settle: Settle,
        carry_seconds: int,
    ):
        self._queue, self._store, self._stats = queue, store, stats
        self.settle, self.carry_seconds = settle, carry_seconds  # how long a recheck waits
        # Set by an inline full audit: second looks for a cascade wait in the audit.
        self.held: list[tuple[Recheck, int]] | None = None

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
