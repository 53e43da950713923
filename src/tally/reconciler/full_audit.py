"""The full audit: every rule over the whole table, for drift the stream cannot show.

Drift that predates the reconciler, or that outlived the stream's 24-hour retention
during an outage, never appears in a batch. The audit scans the table in parallel
segments, tallies children per parent from the scan, and sends every parent whose scanned
numbers disagree (and every parent of orphaned children) through the same settled
recount, repair and alert path as the stream. A scan is not a snapshot, so it only picks
candidates; the settled recount decides. Sequences go through the recheck.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tally.dynamodb import deserialize
from tally.reconciler.rechecks import Recheck
from tally.reconciler.verification import Reconciler
from tally.rules import CountRule, Key, SequenceRule, SumRule

Progress = Callable[[int], None]


@dataclass
class AuditReport:
    """What the audit checked and found."""

    rules: list[str]
    items_scanned: int = 0
    parents: Counter[str] = field(default_factory=Counter)
    candidates: int = 0
    sequences: int = 0
    findings: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "rules": self.rules,
            "items_scanned": self.items_scanned,
            "parents_checked": dict(self.parents),
            "recounted": self.candidates,
            "sequences_checked": self.sequences,
            "findings": dict(self.findings),
            "repairs": dict(self.repairs),
            "seconds": round(self.seconds, 3),
        }


@dataclass
class _Seen:
    """One parent as the scan saw it: its counter, and the children's count or sum."""

    exists: bool = False
    counter: Any = None
    truth: Decimal = Decimal(0)


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
    """Audit all rules, one rule, or one parent; findings go the stream path's way.

    A sequence is judged only up to its counter as the audit saw it, and only once that
    is a grace period old, so a number handed out meanwhile is never voided under its
    writer. ``defer_sequences`` sends them to the recheck queue with that horizon;
    otherwise the audit waits out the longest grace period once and checks them inline.
    """
    started = time.monotonic()
    rules = [reconciler.rules[rule]] if rule else list(reconciler.rules)
    rules = [r for r in rules if r.repair != "off"]
    report = AuditReport([r.name for r in rules])
    before = Counter(reconciler.stats.findings), Counter(reconciler.stats.repairs)
    sequences: list[Recheck] = []
    if parent is not None:
        for target in rules:
            report.parents[target.name] += 1
            _check(reconciler, target, dict(parent), sequences, report, None)
    else:
        seen = _scan(reconciler, rules, segments, report, progress)
        for (name, _), (key, state) in seen.items():
            target = reconciler.rules[name]
            report.parents[name] += 1
            if isinstance(target, SequenceRule) or _disagrees(target, state):
                _check(reconciler, target, key, sequences, report, state.counter)
    _judge_sequences(reconciler, sequences, defer_sequences, sleep)
    reconciler.flush_alerts()
    report.findings = reconciler.stats.findings - before[0]
    report.repairs = reconciler.stats.repairs - before[1]
    report.seconds = time.monotonic() - started
    return report


def _check(
    reconciler: Reconciler,
    target: CountRule | SumRule | SequenceRule,
    key: Key,
    sequences: list[Recheck],
    report: AuditReport,
    scanned: Any,
) -> None:
    if isinstance(target, SequenceRule):
        report.sequences += 1
        # The horizon is the counter as the audit saw it: later numbers are newer.
        counter = (
            scanned if scanned is not None else reconciler.table.read_parent(target, key).counter
        )
        horizon = int(counter) if isinstance(counter, Decimal) and counter >= 0 else 0
        sequences.append(Recheck(target.name, key, horizon, "full audit"))
        return
    report.candidates += 1
    reconciler.verify_parent(target, key, None)


def _judge_sequences(
    reconciler: Reconciler,
    sequences: list[Recheck],
    defer: bool,
    sleep: Callable[[float], None],
) -> None:
    """Recheck each sequence once its horizon is a grace period old."""
    if defer:
        for recheck in sequences:
            target = reconciler.rules[recheck.rule]
            reconciler.schedule_recheck(target, recheck.key, recheck.counter_seen, recheck.reason)
        return
    # Every horizon was read by now: one wait makes each a grace period old.
    grace = max((_grace(reconciler, r) for r in sequences), default=0)
    if grace > 0:
        sleep(grace)
    for recheck in sequences:
        reconciler.recheck(recheck)


def _grace(reconciler: Reconciler, recheck: Recheck) -> int:
    target = reconciler.rules[recheck.rule]
    return target.grace_seconds if isinstance(target, SequenceRule) else 0


def _disagrees(rule: CountRule | SumRule | SequenceRule, seen: _Seen) -> bool:
    if not seen.exists:
        return True  # children without their parent: orphans, if the recount agrees
    counter = seen.counter if seen.counter is not None else Decimal(0)
    return not isinstance(counter, Decimal) or counter != seen.truth


def _scan(
    reconciler: Reconciler,
    rules: list[CountRule | SumRule | SequenceRule],
    segments: int,
    report: AuditReport,
    progress: Progress | None,
) -> dict[tuple[str, str], tuple[Key, _Seen]]:
    """Parallel scan segments, merged into one view per (rule, parent)."""
    names = {r.name for r in rules}
    with ThreadPoolExecutor(segments) as pool:
        parts = list(
            pool.map(
                lambda s: _scan_segment(reconciler, names, s, segments, progress), range(segments)
            )
        )
    merged: dict[tuple[str, str], tuple[Key, _Seen]] = {}
    for scanned, part in parts:
        report.items_scanned += scanned
        for id_, (key, seen) in part.items():
            if id_ not in merged:
                merged[id_] = (key, seen)
                continue
            total = merged[id_][1]
            total.exists = total.exists or seen.exists
            total.counter = seen.counter if seen.exists else total.counter
            total.truth += seen.truth
    return merged


def _scan_segment(
    reconciler: Reconciler, names: set[str], segment: int, segments: int, progress: Progress | None
) -> tuple[int, dict[tuple[str, str], tuple[Key, _Seen]]]:
    view: dict[tuple[str, str], tuple[Key, _Seen]] = {}
    scanned = 0
    for item in _items(reconciler, segment, segments, progress):
        scanned += 1
        for match in reconciler.rules.classify(item):
            target = match.rule
            if target.name not in names:
                continue
            id_ = (target.name, repr(sorted(match.parent_key.items())))
            seen = view.setdefault(id_, (match.parent_key, _Seen()))[1]
            if match.role == "parent":
                seen.exists = True
                seen.counter = item.get(target.counter)
            elif isinstance(target, SumRule):
                amount = item.get(target.summed, Decimal(0))
                seen.truth += amount if isinstance(amount, Decimal) else Decimal(0)
            elif isinstance(target, CountRule):
                seen.truth += 1
    return scanned, view


def _items(
    reconciler: Reconciler, segment: int, segments: int, progress: Progress | None
) -> Iterator[dict[str, Any]]:
    paginator = reconciler.table.client.get_paginator("scan")
    pages = paginator.paginate(
        TableName=reconciler.table.name,
        Segment=segment,
        TotalSegments=segments,
        ReturnConsumedCapacity="TOTAL",
    )
    for page in pages:
        if progress:
            progress(page["ScannedCount"])
        for raw in page["Items"]:
            yield deserialize(raw)
