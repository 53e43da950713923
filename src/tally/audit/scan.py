"""The full audit's scan engine: the table read in parallel segments (read capacity).

The scan keeps one item collection at a time: a parent's children share its partition key,
and a scan returns a partition's items together. Should a collection come back in pieces,
every piece without its parent is itself a candidate, so the recount still sees the whole
collection: a split costs a recount, never a missed drift.

Children found through an index (``through`` rules) live in other item collections: their
parents' truth is gathered over the whole scan, by the base table's attributes (the parent
an item's index key names), one entry per such parent. Items keyed as their children that
the index cannot hold are set aside for the audit to report as ``unindexed``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tally.audit.report import AuditReport
from tally.audit.unindexed import unindexed
from tally.core.dynamodb import deserialize
from tally.core.numbers import add, number, subtract
from tally.reconciler.verification import Reconciler
from tally.rules import (
    AnyRule,
    AttributeMembers,
    CountRule,
    IndexMembers,
    Key,
    SequenceRule,
    SumRule,
    TableKeys,
    TallyRule,
)

Progress = Callable[[int], None]
# Parents waiting between the scanning threads and the recount: bounded, like the rest.
_QUEUE_SIZE = 1000
# A 1 MB page of small items parses into tens of MB of Python objects, per segment.
PAGE_ITEMS = 1000


@dataclass
class _Seen:
    """One parent as the scan saw it: its counter, and the children's count or (exact) sum."""

    exists: bool = False
    counter: Any = None
    truth: Decimal = Decimal(0)
    malformed: bool = False  # a child's amount is not a number: the recount names it


def _disagrees(rule: AnyRule, seen: _Seen) -> bool:
    if not seen.exists or seen.malformed:
        return True  # orphans, or a malformed child: if the recount agrees
    counter = seen.counter if seen.counter is not None else Decimal(0)
    return not isinstance(counter, Decimal) or counter != seen.truth


_Entry = tuple[AnyRule, Key, _Seen]


class _Indexed:
    """What the segments gather for ``through`` rules over the whole scan: each parent's
    counter and its children's truth (a child is in another item collection, so in any
    segment), and the child-like items the index cannot hold."""

    def __init__(self) -> None:
        self.parents: dict[tuple[str, str], _Entry] = {}
        self.unindexed: list[tuple[TallyRule, Key]] = []
        self._lock = threading.Lock()

    def add(self, target: TallyRule, role: str, item: Any, keys: TableKeys, key: Key) -> None:
        """One item that plays ``role`` (parent, or indexed child) for ``target``."""
        if role == "parent":
            with self._lock:
                _tally(self.parents, target, role, key, item)
            return
        if unindexed(target, item, keys) is not None:
            with self._lock:
                self.unindexed.append((target, key))
            return
        parent = target.indexed_parent(item, keys)
        if parent is not None:
            with self._lock:
                _tally(self.parents, target, "child", parent, item)


@dataclass
class _Done:
    """A segment's end: what it read, which index sequences it saw members of, or its error."""

    scanned: int = 0
    capacity: Decimal = Decimal(0)
    members: frozenset[str] = frozenset()
    counters: frozenset[str] = frozenset()
    ledger: list[tuple[str, int, Key]] = field(default_factory=list)
    error: BaseException | None = None


def _scan(
    reconciler: Reconciler,
    rules: list[AnyRule],
    segments: int,
    report: AuditReport,
    progress: Progress | None,
    indexed: _Indexed,
) -> Generator[_Entry, None, None]:
    """Parallel scan segments; each item collection is judged once it has been read, the
    parents of ``through`` rules once every segment has been (gathered in ``indexed``)."""
    names = {r.name for r in rules}
    found: queue.Queue[_Entry | _Done] = queue.Queue(_QUEUE_SIZE)
    stop = threading.Event()
    members: set[str] = set()
    counters: set[str] = set()
    ledger: dict[str, list[tuple[int, Key]]] = {}
    with ThreadPoolExecutor(segments) as pool:
        for segment in range(segments):
            pool.submit(
                _scan_segment,
                reconciler,
                names,
                (segment, segments),
                found,
                stop,
                progress,
                indexed,
            )
        try:
            done = 0
            while done < segments:
                entry = found.get()
                if isinstance(entry, _Done):
                    done += 1
                    if entry.error is not None:
                        raise entry.error
                    report.items_scanned += entry.scanned
                    report.read_capacity += entry.capacity
                    members |= entry.members
                    counters |= entry.counters
                    for name, number, key in entry.ledger:
                        ledger.setdefault(name, []).append((number, key))
                    continue
                yield entry
        finally:
            stop.set()
    yield from indexed.parents.values()
    indexed.parents.clear()
    # Index-layout members live in their own partitions; the counter is judged on its own.
    for name in sorted(members - counters):
        target = reconciler.rules[name]
        yield target, dict(target.parent), _Seen()
    for target in rules:
        if isinstance(target, SequenceRule) and isinstance(target.members, AttributeMembers):
            dropped = reconciler.rebuild_ledger(target, ledger.get(target.name, []))
            # Without a counter, a dropped number may lie above every member still held.
            seen = _Seen(True, dropped) if dropped and not target.has_counter else _Seen()
            yield target, dict(target.parent), seen


def _scan_segment(
    reconciler: Reconciler,
    names: set[str],
    part: tuple[int, int],
    found: queue.Queue[_Entry | _Done],
    stop: threading.Event,
    progress: Progress | None,
    indexed: _Indexed,
) -> None:
    segment, segments = part
    done = _Done()
    members: set[str] = set()
    counters: set[str] = set()
    try:
        keys = reconciler.rules.table
        pk = keys.partition_key
        collection: dict[tuple[str, str], _Entry] = {}
        current: Any = None
        for page in _pages(reconciler, segment, segments):
            if stop.is_set():
                return
            done.capacity += Decimal(
                str((page.get("ConsumedCapacity") or {}).get("CapacityUnits", 0))
            )
            if progress:
                progress(page["ScannedCount"])
            for raw in page["Items"]:
                done.scanned += 1
                item = deserialize(raw)
                if item.get(pk) != current:
                    _flush(collection, found, stop)
                    current = item.get(pk)
                for match in reconciler.rules.classify(item):
                    target = match.rule
                    if target.name not in names:
                        continue
                    if isinstance(target, TallyRule) and target.through is not None:
                        own = reconciler.rules.key_of(item)
                        indexed.add(target, match.role, item, keys, own)
                        continue
                    if isinstance(target, SequenceRule) and isinstance(
                        target.members, AttributeMembers
                    ):
                        number = target.attribute_number(item.get(target.members.number))
                        if match.role == "member" and number is not None:
                            key = reconciler.rules.key_of(item)
                            done.ledger.append((target.name, number, key))
                        continue  # judged after the scan, once the ledger is rebuilt
                    if isinstance(target, SequenceRule) and isinstance(
                        target.members, IndexMembers
                    ):
                        (counters if match.role == "parent" else members).add(target.name)
                        if match.role != "parent":
                            continue
                    _tally(collection, target, match.role, match.parent_key, item)
        _flush(collection, found, stop)
    except BaseException as error:
        done.error = error
    finally:
        done.members, done.counters = frozenset(members), frozenset(counters)
        _put(found, done, stop)


def _tally(
    collection: dict[tuple[str, str], _Entry], target: AnyRule, role: str, key: Key, item: Any
) -> None:
    id_ = (target.name, repr(sorted(key.items())))
    seen = collection.setdefault(id_, (target, key, _Seen()))[2]
    if role == "parent":
        seen.exists = True
        seen.counter = item.get(target.counter)
    elif role == "shard":
        # A Region's part of a split counter (the counter is the parent's and its shards'):
        # taken off the truth, so the parent's own counter is compared with what is left.
        part = item.get(target.counter, Decimal(0))
        if isinstance(part, Decimal) and part.is_finite():
            seen.truth = subtract(seen.truth, part)
        else:
            seen.malformed = True  # the recount judges it
    elif isinstance(target, SumRule):
        amount = number(item.get(target.summed, Decimal(0)))
        if isinstance(amount, Decimal):
            seen.truth = add(seen.truth, amount)
        else:
            seen.malformed = True
    elif isinstance(target, CountRule):
        seen.truth += 1


def _flush(
    collection: dict[tuple[str, str], _Entry],
    found: queue.Queue[_Entry | _Done],
    stop: threading.Event,
) -> None:
    for entry in collection.values():
        _put(found, entry, stop)
    collection.clear()


def _put(found: queue.Queue[_Entry | _Done], entry: _Entry | _Done, stop: threading.Event) -> None:
    """Hand over to the checking thread; give up once it has stopped listening."""
    while not stop.is_set():
        try:
            found.put(entry, timeout=0.1)
            return
        except queue.Full:
            continue


def _pages(reconciler: Reconciler, segment: int, segments: int) -> Iterator[dict[str, Any]]:
    paginator = reconciler.table.client.get_paginator("scan")
    yield from paginator.paginate(
        TableName=reconciler.table.name,
        Segment=segment,
        TotalSegments=segments,
        Limit=PAGE_ITEMS,
        ReturnConsumedCapacity="TOTAL",
    )
