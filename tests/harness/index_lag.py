"""An eventually consistent global secondary index, for DynamoDB Local (whose indexes are
updated in the same call as the table, so a Query through them is never stale).

How it works. The lagging index is a *shadow table*: a copy of the table's key schema and
global secondary indexes (same names, key attributes and projections), with no stream. A
``StreamTap`` reads the real table's stream continuously (its own reader, about twenty polls
a second) and hands each record, stamped with the time it was seen, to ``LaggingIndex``.
``LagSchedule`` (pure) gives each change a due time, ``seen + lag ± jitter``, never earlier
than the previous change of the same item (an index applies one item's changes in order);
``LaggingIndex.apply_due`` writes the changes that are due into the shadow table (the new
image, or a delete). A botocore ``before-parameter-build`` hook, registered on one client
only (the reconciler's), sends every ``Query`` and ``Scan`` that names an ``IndexName`` on
the real table to the shadow table instead. Base-table reads (GetItem, BatchGetItem,
TransactGetItems, a Query without ``IndexName``) are never touched.

So a Query through the index sees the table as it was ``lag`` (± jitter) before the tap saw
each change: an edge that just joined a parent is missing from it; one that just left it
(deleted, re-parented, its status changed) is still there, with its old index attributes;
``Items``, ``Count``, ``ScannedCount``, ``LastEvaluatedKey`` pagination, key conditions,
filters, projections and ``ConsumedCapacity`` are DynamoDB Local's own answers from the
shadow. The effective lag is ``lag`` plus the tap's delay (the stream's own latency and one
poll interval): the index is never ahead of the table, only further behind.

    index = LaggingIndex(dynamodb, table, lag=1.5, jitter=0.3, seed=1)
    tap = StreamTap(reader, [index.observe])
    index.install(runtime._clients()[0])  # the reconciler's client, nobody else's
    tap.start(); index.start()
    ...
    index.stop(); tap.stop(); index.close()

Binary attributes are not supported (the tap's records carry them base64-encoded).
"""

from __future__ import annotations

import contextlib
import heapq
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A change written this long after its due time counts as late (the index lagged more).
LATE_SECONDS = 0.2
Key = tuple[tuple[str, str], ...]  # an item's key: sorted (name, scalar text) pairs
Observer = Callable[[list[dict[str, Any]], float], None]


def item_key(keys: dict[str, Any]) -> Key:
    """A hashable form of a serialized key (``{"pk": {"S": "x"}, ...}``)."""
    return tuple(sorted((name, str(next(iter(value.values())))) for name, value in keys.items()))


@dataclass(order=True, frozen=True)
class Change:
    """One item's change as the index will apply it: its new image, or None (removed)."""

    due: float
    sequence: int
    key: Key = field(compare=False)
    keys: dict[str, Any] = field(compare=False, hash=False)
    image: dict[str, Any] | None = field(compare=False, hash=False)
    seen: float = field(compare=False)


class LagSchedule:
    """When each observed change reaches the index (pure: time is passed in).

    A change seen at ``seen`` is due at ``seen + lag + u``, ``u`` drawn uniformly from
    ``[-jitter, jitter]`` by a seeded RNG, or at its item's previous change's due time if
    that is later: one item's changes are applied in stream order. A record seen again
    (a redelivery) or older than one already seen for its item is ignored.
    """

    def __init__(self, lag: float, jitter: float = 0.0, seed: int = 0):
        if lag < 0 or jitter < 0 or jitter > lag:
            raise ValueError("need 0 <= jitter <= lag")
        self.lag, self.jitter = lag, jitter
        self._rng = random.Random(seed)
        self._queue: list[Change] = []
        self._last_due: dict[Key, float] = {}
        self._last_sequence: dict[Key, int] = {}

    def observe(
        self, keys: dict[str, Any], image: dict[str, Any] | None, sequence: int, seen: float
    ) -> Change | None:
        key = item_key(keys)
        if sequence <= self._last_sequence.get(key, -1):
            return None
        self._last_sequence[key] = sequence
        delay = self.lag + self._rng.uniform(-self.jitter, self.jitter)
        due = max(seen + delay, self._last_due.get(key, float("-inf")))
        self._last_due[key] = due
        change = Change(due, sequence, key, keys, image, seen)
        heapq.heappush(self._queue, change)
        return change

    def due(self, now: float) -> list[Change]:
        """The changes due by ``now``, removed from the schedule, in the order to apply."""
        ready = []
        while self._queue and self._queue[0].due <= now:
            ready.append(heapq.heappop(self._queue))
        return ready

    def everything(self) -> list[Change]:
        """Every change still pending, as if its time had come (to start from a settled index)."""
        return self.due(float("inf"))

    @property
    def pending(self) -> int:
        return len(self._queue)

    def next_due(self) -> float | None:
        return self._queue[0].due if self._queue else None


def shadow_table_kwargs(description: dict[str, Any], name: str) -> dict[str, Any]:
    """create_table kwargs for a copy of ``description``'s keys and global secondary indexes
    (on demand, no stream, no local indexes)."""
    kwargs: dict[str, Any] = {
        "TableName": name,
        "AttributeDefinitions": description["AttributeDefinitions"],
        "KeySchema": description["KeySchema"],
        "BillingMode": "PAY_PER_REQUEST",
    }
    indexes = [
        {"IndexName": i["IndexName"], "KeySchema": i["KeySchema"], "Projection": i["Projection"]}
        for i in description.get("GlobalSecondaryIndexes", [])
    ]
    if indexes:
        kwargs["GlobalSecondaryIndexes"] = indexes
    return kwargs


class _Background:
    """Runs a loop on a daemon thread of its own until ``stop``, which waits for it."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _start(self, loop: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=loop, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class LaggingIndex(_Background):
    """The table's global secondary indexes, ``lag`` seconds behind (see the module's text)."""

    def __init__(
        self,
        dynamodb: Any,
        table: str,
        *,
        lag: float = 1.5,
        jitter: float = 0.3,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
        keep: Callable[[dict[str, Any]], bool] | None = None,
    ):
        """``keep``: given a record's (serialized) key, whether the shadow needs the item; an
        item no Query through an index can return may be left out (the shadow's writes load
        DynamoDB Local as much as the table's own)."""
        self.dynamodb, self.table, self.clock = dynamodb, table, clock
        self.keep = keep
        self.schedule = LagSchedule(lag, jitter, seed)
        self.shadow = f"{table}-lagging-index"
        description = dynamodb.describe_table(TableName=table)["Table"]
        self.indexes = {i["IndexName"] for i in description.get("GlobalSecondaryIndexes", [])}
        dynamodb.create_table(**shadow_table_kwargs(description, self.shadow))
        dynamodb.get_waiter("table_exists").wait(
            TableName=self.shadow, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )
        self.applied = 0
        self.redirected = 0
        # How long after its due time a change reached the shadow, at most; how many were
        # more than LATE_SECONDS late (the index then lagged more than lag + jitter).
        self.max_late = 0.0
        self.max_late_at = 0.0  # when it was written
        self.max_write_seconds = 0.0  # the longest BatchWriteItem to the shadow
        self.max_gap = 0.0  # the longest time between two rounds of the applying thread
        self.late = 0
        # The schedule's lock is held only to read or change it: the tap's observing and the
        # reconciler's redirected queries never wait for the shadow's writes, which one
        # writer at a time makes in due order under their own lock.
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._clients: list[Any] = []
        super().__init__()

    # --- what the index learns -------------------------------------------------------

    def observe(self, records: Sequence[dict[str, Any]], seen: float | None = None) -> None:
        """Stream records (Lambda's shape) seen at ``seen`` (default: now)."""
        at = self.clock() if seen is None else seen
        with self._lock:
            for record in records:
                stream = record["dynamodb"]
                if self.keep is not None and not self.keep(stream["Keys"]):
                    continue
                self.schedule.observe(
                    stream["Keys"], stream.get("NewImage"), int(stream["SequenceNumber"]), at
                )

    def apply_due(self, now: float | None = None) -> int:
        """Write the changes due by ``now`` into the shadow table; returns how many."""
        with self._writing:
            with self._lock:
                ready = self.schedule.due(self.clock() if now is None else now)
            self._write(ready, measure=True)
            return len(ready)

    def catch_up(self) -> int:
        """Apply every pending change at once (a settled index, e.g. after the set-up)."""
        with self._writing:
            with self._lock:
                ready = self.schedule.everything()
            self._write(ready)
            return len(ready)

    def _write(self, changes: list[Change], measure: bool = False) -> None:
        """Apply ``changes`` (in due order) in BatchWriteItem requests: of one item's changes
        due together only the last is written (the ones before it would be visible for no
        time at all), so no request names an item twice."""
        last = {change.key: change for change in changes}
        ordered = sorted(last.values())
        for start in range(0, len(ordered), 25):
            chunk = ordered[start : start + 25]
            requests = [
                {"DeleteRequest": {"Key": c.keys}}
                if c.image is None
                else {"PutRequest": {"Item": c.image}}
                for c in chunk
            ]
            pending: dict[str, Any] = {self.shadow: requests}
            began = time.monotonic()
            while pending:
                answer = self.dynamodb.batch_write_item(RequestItems=pending)
                pending = answer.get("UnprocessedItems") or {}
            self.max_write_seconds = max(self.max_write_seconds, time.monotonic() - began)
            if measure:
                late = time.time() - chunk[0].due
                if late > self.max_late:
                    self.max_late, self.max_late_at = late, time.time()
                self.late += sum(1 for c in chunk if time.time() - c.due > LATE_SECONDS)
        self.applied += len(changes)

    # --- who reads it --------------------------------------------------------------------

    def install(self, client: Any) -> LaggingIndex:
        """Send ``client``'s Query and Scan through an index of the table to the shadow."""
        for operation in ("Query", "Scan"):
            client.meta.events.register(
                f"before-parameter-build.dynamodb.{operation}", self._redirect
            )
        self._clients.append(client)
        return self

    def uninstall(self) -> None:
        for client in self._clients:
            for operation in ("Query", "Scan"):
                client.meta.events.unregister(
                    f"before-parameter-build.dynamodb.{operation}", self._redirect
                )
        self._clients.clear()

    def _redirect(self, params: dict[str, Any], **_: Any) -> None:
        if params.get("TableName") == self.table and params.get("IndexName") in self.indexes:
            params["TableName"] = self.shadow
            self.redirected += 1  # a statistic: a lost increment between threads is no harm

    # --- running -----------------------------------------------------------------------

    def start(self, interval: float = 0.05) -> LaggingIndex:
        def run() -> None:
            last = time.monotonic()
            while not self._stop.wait(interval):
                now = time.monotonic()
                self.max_gap, last = max(self.max_gap, now - last), now
                self.apply_due()

        self._start(run, "lagging-index")
        return self

    def close(self) -> None:
        self.stop()
        self.uninstall()
        with contextlib.suppress(self.dynamodb.exceptions.ResourceNotFoundException):
            self.dynamodb.delete_table(TableName=self.shadow)


class StreamTap(_Background):
    """Reads a table's stream on a thread of its own and hands every record to each
    observer, with the time it was seen. Observers run on the tap's thread, in stream order."""

    def __init__(
        self,
        reader: Any,
        observers: Iterable[Observer],
        interval: float = 0.05,
        clock: Callable[[], float] = time.time,
    ):
        self.reader, self.observers, self.interval = reader, list(observers), interval
        self.clock = clock
        self.records = 0
        self.errors: list[BaseException] = []
        super().__init__()

    def poll(self) -> int:
        """One read of every shard; returns how many records it handed out."""
        records = self.reader.poll(limit=1000)
        if records:
            seen = self.clock()
            for observer in self.observers:
                observer(records, seen)
            self.records += len(records)
        return len(records)

    def drain(self, idle_polls: int = 3) -> None:
        """Poll until ``idle_polls`` polls in a row find nothing (only while not started)."""
        idle = 0
        while idle < idle_polls:
            idle = 0 if self.poll() else idle + 1

    def start(self) -> StreamTap:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    moved = self.poll()
                except Exception as error:  # kept for the run's report
                    self.errors.append(error)
                    moved = 0
                if not moved:
                    self._stop.wait(self.interval)

        self._start(run, "stream-tap")
        return self
