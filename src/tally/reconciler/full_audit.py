"""The full audit: every rule over the whole table, for drift the stream cannot show.

Drift that predates the reconciler, or that outlived the stream's 24-hour retention
during an outage, never appears in a batch. Two engines pick candidates: the scan engine
reads the table in parallel segments (read capacity, for small tables), and the export
engines run the audit query (``audit_sql``) over a DynamoDB export (no read capacity).
Neither sees a snapshot of now, so both only pick candidates; every candidate goes
through the same settled recount, repair and alert path as the stream, and sequences
through the recheck.

The scan engine keeps one item collection at a time: a parent's children share its
partition key, and a scan returns a partition's items together. Should a collection come
back in pieces, every piece without its parent is itself a candidate, so the recount still
sees the whole collection: a split costs a recount, never a missed drift.

Children found through an index (``through`` rules) live in other item collections: their
parents' truth is gathered over the whole scan, by the base table's attributes (the parent
an item's index key names), one entry per such parent. Items keyed as their children that
the index cannot hold are reported as ``unindexed`` (``tally.reconciler.unindexed``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import deserialize
from tally.core.numbers import add, number
from tally.reconciler.candidates import Candidate
from tally.reconciler.findings import Off
from tally.reconciler.rechecks import Recheck
from tally.reconciler.scheduling import INDEX_CONFIRM, INDEX_MOVED
from tally.reconciler.unindexed import finding as unindexed_finding
from tally.reconciler.unindexed import read_unindexed, unindexed
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
)

Progress = Callable[[int], None]
# Parents waiting between the scanning threads and the recount: bounded, like the rest.
_QUEUE_SIZE = 1000
# A 1 MB page of small items parses into tens of MB of Python objects, per segment.
PAGE_ITEMS = 1000


# Looks an inline audit takes itself: a parent whose children are found through an index
# needs three (docs/verification.md, "Children found through an index"); later ones are
# left to the recheck queue.
INLINE_LOOKS = 3
INDEX_LOOKS = frozenset({INDEX_MOVED, INDEX_CONFIRM})


@dataclass
class AuditReport:
    """What the audit checked and found."""

    rules: list[str]
    engine: str = "scan"
    items_scanned: int = 0
    read_capacity: Decimal = Decimal(0)
    export: dict[str, Any] | None = None
    parents: Counter[str] = field(default_factory=Counter)
    candidates: int = 0
    recounted: int = 0
    sequences: int = 0
    # Items keyed as children of a ``through`` rule that its index cannot hold, as the engine
    # saw them (each is read again before it is reported).
    unindexed: int = 0
    findings: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    # Every parent found off: new, standing (alerted before, still off) or unconfirmed.
    state: list[Off] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "rules": self.rules,
            "engine": self.engine,
            "items_scanned": self.items_scanned,
            "read_capacity": float(self.read_capacity),
            "export": self.export,
            "parents_checked": dict(self.parents),
            "candidates": self.candidates,
            "recounted": self.recounted,
            "sequences_checked": self.sequences,
            "unindexed_seen": self.unindexed,
            "findings": dict(self.findings),
            "repairs": dict(self.repairs),
            "seconds": round(self.seconds, 3),
            "state": [
                off.finding.body() | {"status": off.status, "alerted_at": off.alerted_at}
                for off in self.state
            ],
        }


@dataclass
class _Seen:
    """One parent as the scan saw it: its counter, and the children's count or (exact) sum."""

    exists: bool = False
    counter: Any = None
    truth: Decimal = Decimal(0)
    malformed: bool = False  # a child's amount is not a number: the recount names it


def audited_rules(reconciler: Reconciler, rule: str | None = None) -> list[AnyRule]:
    """All rules, or the one named, that the audit checks (``repair = "off"`` ones never)."""
    rules = [reconciler.rules[rule]] if rule else list(reconciler.rules)
    return [r for r in rules if r.repair != "off"]


class Audit:
    """One audit run: the report, and the findings the reconciler made meanwhile."""

    def __init__(
        self,
        reconciler: Reconciler,
        rules: list[AnyRule],
        engine: str,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.reconciler = reconciler
        self.report = AuditReport([r.name for r in rules], engine=engine)
        self._started = time.monotonic()
        self._before = Counter(reconciler.stats.findings), Counter(reconciler.stats.repairs)
        self._off_from = len(reconciler.off)
        self._sleep = sleep
        self._due: list[Recheck] = []
        # Orphans are judged on a second look a grace period later: inline, in ``finish``.
        self._later: list[tuple[Recheck, int]] = []

    def check(self, target: AnyRule, key: Key, defer: bool, horizon: Any = None) -> None:
        """One candidate through the stream's path: recount, or the sequence recheck.

        ``horizon`` is the sequence counter the engine saw: numbers above it were handed
        out later. A sequence is judged only up to it, and only once that is a grace period
        old, so a number handed out meanwhile is never voided under its writer: deferred,
        through the recheck queue; inline, after one wait for all of them (``finish``).
        """
        self.report.candidates += 1
        reconciler = self.reconciler
        if isinstance(target, SequenceRule):
            self.report.sequences += 1
            if horizon is None or not target.has_counter:
                end = reconciler.sequence_horizon(target, key)
                if not target.has_counter and isinstance(horizon, int | Decimal):
                    # Without a counter: the highest member, or a number given up above it.
                    end = max(end, horizon)
                horizon = end
            seen = int(horizon) if isinstance(horizon, int | Decimal) and horizon >= 0 else 0
            if defer:
                reconciler.schedule_recheck(target, key, seen, "full audit")
            else:
                epoch = reconciler.sequence_epoch(target, key)  # the horizon's life
                self._due.append(Recheck(target.name, key, seen, "full audit", epoch=epoch))
            return
        self.report.recounted += 1
        reconciler.hold_cascade_rechecks(None if defer else self._later)
        reconciler.audit_parent(target, key)  # aggregated: a finding only a lag later

    def check_unindexed(self, target: CountRule | SumRule, key: Key) -> None:
        """A child-like item the index could not hold when the engine read it: read again
        (consistently), and reported as ``unindexed`` if it still is; never repaired."""
        self.report.unindexed += 1
        reconciler = self.reconciler
        table = reconciler.table
        why, response = read_unindexed(
            table.client, table.name, target, key, reconciler.rules.table
        )
        table.reads.add(response, 1 if "Item" in response else 0)
        if why is not None:
            # Audit-only: no recount can see it, so it goes straight to the reporter.
            reconciler._reporter.alert_unrepaired(unindexed_finding(target, table.name, key, why))

    def check_candidates(self, candidates: Iterable[Candidate], defer: bool) -> None:
        """The audit query's rows, each through the same path as a scanned candidate."""
        for candidate in candidates:
            target = self.reconciler.rules[candidate.rule]
            if candidate.problems.get("unindexed"):
                assert isinstance(target, CountRule | SumRule)  # parse_candidate checked it
                self.check_unindexed(target, candidate.key)
                continue
            self.report.parents[target.name] += 1
            self.check(target, candidate.key, defer, candidate.counter_seen)

    def finish(self) -> AuditReport:
        """Judge the inline sequences once their horizons are a grace period old, and take
        the later looks the parents ask for (children found through an index take up to
        three: their parent held still, then the same truth twice); report."""
        due = [(recheck, _grace(self.reconciler, recheck)) for recheck in self._due]
        due += self._later
        for look in range(INLINE_LOOKS):
            if not due:
                break
            grace = max(delay for _, delay in due)
            if grace > 0:
                self._sleep(grace)  # every horizon was read by now: one wait ages them all
            self._later = []
            last = look == INLINE_LOOKS - 1
            self.reconciler.hold_cascade_rechecks(None if last else self._later)
            for recheck, _ in due:
                self.reconciler.recheck(recheck)
            # Only an index's looks are taken again here; a second look that differs
            # (a cascade still under way) goes to the queue.
            due = [(r, delay) for r, delay in self._later if r.reason in INDEX_LOOKS]
            for recheck, delay in self._later:
                if recheck.reason not in INDEX_LOOKS:
                    self.reconciler.rechecks.schedule(recheck, delay)
        self.reconciler.hold_cascade_rechecks(None)
        self.reconciler.flush_alerts()
        stats = self.reconciler.stats
        self.report.findings = stats.findings - self._before[0]
        self.report.repairs = stats.repairs - self._before[1]
        self.report.state = self.reconciler.standing_state(self._off_from)
        self.report.seconds = time.monotonic() - self._started
        return self.report


def full_audit(
    reconciler: Reconciler,
    *,
    rule: str | None = None,
    parent: Key | None = None,
    segments: int = 4,
    defer_sequences: bool = False,
    progress: Progress | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> AuditReport:
    """Audit all rules, one rule, or one parent with the scan engine.

    A sequence is judged only up to its counter as the audit saw it, and only once that
    is a grace period old, so a number handed out meanwhile is never voided under its
    writer. ``defer_sequences`` sends them to the recheck queue with that horizon;
    otherwise the audit waits out the longest grace period once and checks them inline.
    """
    rules = audited_rules(reconciler, rule)
    audit = Audit(reconciler, rules, "scan", sleep)
    if parent is not None:
        for target in rules:
            audit.report.parents[target.name] += 1
            audit.check(target, dict(parent), defer_sequences)
        return audit.finish()
    indexed = _Indexed()
    # Closed on the way out, error or not, so the scanning threads stop with the audit.
    with closing(_scan(reconciler, rules, segments, audit.report, progress, indexed)) as scanned:
        for target, key, seen in scanned:
            audit.report.parents[target.name] += 1
            if isinstance(target, SequenceRule) or _disagrees(target, seen):
                audit.check(target, key, defer_sequences, seen.counter if seen.exists else None)
    for target, key in indexed.unindexed:
        audit.check_unindexed(target, key)
    return audit.finish()


def _grace(reconciler: Reconciler, recheck: Recheck) -> int:
    target = reconciler.rules[recheck.rule]
    return target.grace_seconds if isinstance(target, SequenceRule) else 0


def _disagrees(rule: AnyRule, seen: _Seen) -> bool:
    if not seen.exists or seen.malformed:
        return True  # orphans, or a malformed child: if the recount agrees
    counter = seen.counter if seen.counter is not None else Decimal(0)
    return not isinstance(counter, Decimal) or counter != seen.truth


# --- the scan ----------------------------------------------------------------------------

_Entry = tuple[AnyRule, Key, _Seen]


class _Indexed:
    """What the segments gather for ``through`` rules over the whole scan: each parent's
    counter and its children's truth (a child is in another item collection, so in any
    segment), and the child-like items the index cannot hold."""

    def __init__(self) -> None:
        self.parents: dict[tuple[str, str], _Entry] = {}
        self.unindexed: list[tuple[CountRule | SumRule, Key]] = []
        self._lock = threading.Lock()

    def add(
        self, target: CountRule | SumRule, role: str, item: Any, keys: TableKeys, key: Key
    ) -> None:
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
                    if isinstance(target, CountRule | SumRule) and target.through is not None:
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
