"""What one invocation did, for metrics and logs. Verification appends what it came to
(``Outcome``) to a list its caller gives it (``StatsBook.counting``), counted when the work
ends, also when it failed; the reporter and the scheduler count what they send. Item
collections that run at once count into shares of their own, added up in the calling thread.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

T = TypeVar("T")


class Outcome(Enum):
    """What verifying one group, parent or sequence came to."""

    PROVED = "proved"  # step 1: the batch proved it, with zero reads
    CARRIED = "carried"  # step 1b: a remainder carried to its recheck
    CONSISTENT = "consistent"  # checked against the table: consistent
    CHECKED = "checked"  # checked against the table: off (found, or waiting for a look)
    DEFERRED = "deferred"  # the parent never held still: checked later
    DECREMENTED = "decremented"  # a TTL expiry applied as a decrement
    LEFT = "left"  # left to a recheck, nothing judged yet

    @staticmethod
    def reached_table(outcomes: Iterable[Outcome]) -> bool:
        """Whether the verification went past the stream to the table (alerts may follow)."""
        return not _STREAM_ONLY.issuperset(outcomes)


_STREAM_ONLY = frozenset({Outcome.PROVED, Outcome.CARRIED, Outcome.DECREMENTED})
# What a verification came to, appended as it goes: what it did before a failure interrupted
# it is counted too (a retry finds a TTL decrement applied, and counts it no more).
Done = list[Outcome]


@dataclass
class Stats:
    """What one invocation did, for metrics and logs."""

    records: int = 0
    skipped: int = 0
    own_writes: int = 0
    malformed: int = 0
    groups: int = 0
    balanced: int = 0
    carried: int = 0
    checked: int = 0
    consistent: int = 0
    deferred: int = 0
    rechecks: int = 0
    coalesced: int = 0  # looks at aggregated counters another look on its way covered
    ttl_decrements: int = 0
    alerts: int = 0
    findings: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    drift_lifetimes: list[float] = field(default_factory=list)
    # A Global Table: (source Region, seconds) measured on each heartbeat heard.
    replication_lags: list[tuple[str, float]] = field(default_factory=list)
    held: int = 0  # settled findings held while a replication link was behind
    errors: list[str] = field(default_factory=list)

    def count(self, outcomes: Iterable[Outcome]) -> None:
        """Count what a verification came to."""
        for outcome in outcomes:
            if outcome is Outcome.PROVED:  # most groups of most batches
                self.balanced += 1
                self.checked += 1
                self.consistent += 1
            elif outcome is Outcome.CONSISTENT:
                self.checked += 1
                self.consistent += 1
            elif outcome is Outcome.CHECKED:
                self.checked += 1
            elif outcome is Outcome.CARRIED:
                self.carried += 1
            elif outcome is Outcome.DEFERRED:
                self.deferred += 1
            elif outcome is Outcome.DECREMENTED:
                self.ttl_decrements += 1

    def merge(self, other: Stats) -> None:
        """Add what ``other`` counted (one item collection's share of a batch)."""
        for name, value in vars(other).items():
            if isinstance(value, Counter):
                getattr(self, name).update(value)
            elif isinstance(value, list):
                getattr(self, name).extend(value)
            else:
                setattr(self, name, getattr(self, name) + value)


class StatsBook:
    """The invocation's ``Stats``; inside a concurrent item collection's work, its share.

    Calling the book gives the ``Stats`` the current thread counts into."""

    def __init__(self) -> None:
        self.total = Stats()
        self._local = threading.local()

    def __call__(self) -> Stats:
        share: Stats | None = getattr(self._local, "stats", None)
        return self.total if share is None else share

    @contextmanager
    def counting(self) -> Iterator[Done]:
        """A list for one verification to append what it came to, counted when the work ends,
        also when it failed: what it did before the failure happened."""
        done: Done = []
        try:
            yield done
        finally:
            self().count(done)

    def counted(self, work: Callable[[], T]) -> tuple[T, Stats]:
        """Run ``work`` counting into a share of its own; the caller merges it."""
        self._local.stats = Stats()
        try:
            return work(), self._local.stats
        finally:
            self._local.stats = None
