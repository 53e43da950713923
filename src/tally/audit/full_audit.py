"""The full audit: every rule over the whole table, for drift the stream cannot show.

Drift that predates the reconciler, or that outlived the stream's 24-hour retention
during an outage, never appears in a batch. Two engines pick candidates: the scan engine
reads the table in parallel segments (read capacity, for small tables), and the export
engines run the audit query (``sql``) over a DynamoDB export (no read capacity).
Neither sees a snapshot of now, so both only pick candidates; every candidate goes
through the same settled recount, repair and alert path as the stream, and sequences
through the recheck.

The scan engine (``tally.audit.scan``) reads one item collection at a time, and
gathers the parents of children found through an index over the whole scan. Items keyed as
such children that the index cannot hold are reported as ``unindexed``
(``tally.audit.unindexed``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import closing
from decimal import Decimal
from typing import Any

from tally.audit.candidates import Candidate
from tally.audit.report import AuditReport
from tally.audit.scan import Progress, _disagrees, _Indexed, _scan
from tally.audit.unindexed import finding as unindexed_finding
from tally.audit.unindexed import read_unindexed
from tally.reconciler.report.rechecks import Recheck
from tally.reconciler.report.scheduling import INDEX_CONFIRM, INDEX_MOVED
from tally.reconciler.verification import Reconciler
from tally.rules import AnyRule, Key, SequenceRule, TallyRule

# Looks an inline audit takes itself: a parent whose children are found through an index
# needs three (docs/verification.md, "Children found through an index"); later ones are
# left to the recheck queue.
INLINE_LOOKS = 3
INDEX_LOOKS = frozenset({INDEX_MOVED, INDEX_CONFIRM})


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

    def check_unindexed(self, target: TallyRule, key: Key) -> None:
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
            reconciler.alert_unrepaired(unindexed_finding(target, table.name, key, why))

    def check_candidates(
        self, candidates: Iterable[Candidate], defer: bool, progress: Progress | None = None
    ) -> None:
        """The audit query's rows, each through the same path as a scanned candidate;
        ``progress`` is told each one checked."""
        for candidate in candidates:
            target = self.reconciler.rules[candidate.rule]
            if candidate.problems.get("unindexed"):
                assert isinstance(target, TallyRule)  # parse_candidate checked it
                self.check_unindexed(target, candidate.key)
            else:
                self.report.parents[target.name] += 1
                self.check(target, candidate.key, defer, candidate.counter_seen)
            if progress:
                progress(1)

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
                    self.reconciler.send_recheck(recheck, delay)
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
