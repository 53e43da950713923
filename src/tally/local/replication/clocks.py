"""Each Region's clock for hidden stamps, and the per-key locks that keep a Region's stamps in
the order its writes commit.

A Region stamps a write with its own clock (plus the skew a test gives it) but never at or
before a stamp it has already handed out or received: a write is always later than the
version it replaces there (inferred; docs/global-tables.md).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class RegionClock:
    def __init__(self, region: str, skew_us: int = 0, now: Callable[[], int] | None = None):
        self.region = region
        self.skew_us = skew_us
        self._now = now or (lambda: time.time_ns() // 1000)
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        """A new stamp: this Region's time, later than every stamp seen here."""
        with self._lock:
            self._last = max(self._now() + self.skew_us, self._last + 1)
            return self._last

    def observe(self, at: int) -> None:
        """A stamp that arrived here: later local writes are stamped after it."""
        with self._lock:
            self._last = max(self._last, at)


class KeyLocks:
    """Striped locks over (Region, table, key): a write to a replicated item holds its keys
    from the moment it is stamped until it committed, and so does a replicated apply."""

    def __init__(self, stripes: int = 128):
        self._locks = [threading.Lock() for _ in range(stripes)]

    @contextlib.contextmanager
    def hold(self, region: str, keys: Iterable[Any]) -> Iterator[None]:
        stripes = sorted({hash((region, k)) % len(self._locks) for k in keys})
        with contextlib.ExitStack() as held:
            for stripe in stripes:
                held.enter_context(self._locks[stripe])
            yield
