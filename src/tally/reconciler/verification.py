"""The verification protocol (docs/verification.md), top to bottom in DESIGN's order.

1. Fast path: a group whose counter deltas equal its child deltas proves itself; no read.
2. Settled recount: read the parent, count or sum the children, read the parent again;
   an unchanged revision makes the count a snapshot. Retry, then defer to a recheck.
3. Repair: SET the counter to the truth, fenced on the verified counter and revision,
   logged in the same transaction; a failed fence means re-verify, never force.
4. Gaps: an unbalanced sequence waits out its grace period; the recheck is authoritative.
5. Alerts: one message per finding, with its repair outcome, de-duplicated.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from tally.reconciler.alerts import AlertPublisher
from tally.reconciler.audit_store import AuditStore
from tally.reconciler.changes import Group, group_records
from tally.reconciler.findings import Finding, Kind, Repair
from tally.reconciler.rechecks import Recheck, RecheckQueue
from tally.reconciler.repairs import RepairPolicy
from tally.reconciler.table import ParentState, Tally, TallyTable
from tally.rules import CountRule, Key, RuleSet, SequenceRule, SumRule

TallyRule = CountRule | SumRule


@dataclass(frozen=True)
class Settle:
    """How hard step 2 tries before it defers to a recheck."""

    attempts: int = 4
    pause_seconds: float = 0.05
    # A parent too busy to hold still is looked at again later, not hammered: a hot parent
    # would otherwise cost a full recount per retry for as long as it stays hot.
    defer_seconds: int = 30


@dataclass
class Stats:
    """What one invocation did, for metrics and logs."""

    records: int = 0
    skipped: int = 0
    own_writes: int = 0
    malformed: int = 0
    groups: int = 0
    balanced: int = 0
    checked: int = 0
    consistent: int = 0
    deferred: int = 0
    rechecks: int = 0
    ttl_decrements: int = 0
    alerts: int = 0
    findings: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    drift_lifetimes: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Snapshot:
    """A settled read: the parent and its children's truth at one moment."""

    parent: ParentState
    tally: Tally
    confirmations: int = 1


class Reconciler:
    """Verifies stream batches and sequence rechecks against the table's children."""

    def __init__(
        self,
        rules: RuleSet,
        table: TallyTable,
        store: AuditStore,
        alerts: AlertPublisher,
        rechecks: RecheckQueue,
        policy: RepairPolicy,
        settle: Settle | None = None,
    ):
        self.rules = rules
        self.table = table
        self.store = store
        self.alerts = alerts
        self.rechecks = rechecks
        self.policy = policy
        self.settle = settle or Settle()
        self.stats = Stats()
        self.log: list[Finding] = []

    def verify_batch(self, records: Iterable[Mapping[str, Any]]) -> list[str]:
        """Verify one stream batch; return the sequence numbers to report as failed."""
        batch = group_records(records, self.rules)
        self.stats.records += batch.records
        self.stats.skipped += batch.skipped
        self.stats.own_writes += batch.own_writes
        self.stats.malformed += len(batch.malformed)
        failed = []
        for group in batch.groups.values():
            if group.rule.repair == "off":
                continue
            self.stats.groups += 1
            try:
                self.verify_group(group)
            except Exception as error:
                # Throttling or an outage mid-check: retry this group's records, only them.
                failed.append(group.first_sequence_number)
                where = f"{group.rule.name} {group.parent_key}"
                self.stats.errors.append(f"{where}: {type(error).__name__}: {error}")
        return sorted(failed, key=int)

    def verify_group(self, group: Group) -> None:
        rule = group.rule
        if isinstance(rule, CountRule | SumRule):
            self.apply_ttl_expiries(rule, group)
        # Step 1: a balanced batch proves that nothing new drifted: zero reads.
        if group.balanced:
            self.stats.balanced += 1
            self.stats.checked += 1
            self.stats.consistent += 1
            return
        if isinstance(rule, SequenceRule):
            # Step 4: not a gap yet; the increment and its put may sit in different batches.
            self.schedule_recheck(rule, group.parent_key, _counter_horizon(group), "unbalanced")
            return
        self.verify_parent(rule, group.parent_key, group)

    # --- step 2: settled recount ---------------------------------------------------------

    def verify_parent(
        self, rule: TallyRule, key: Key, group: Group | None, *, retry_fence: bool = True
    ) -> None:
        """Recount one parent; repair and report what is wrong."""
        snapshot = self.settled_recount(rule, key)
        if snapshot is None:
            self.stats.deferred += 1
            self.schedule_recheck(rule, key, 0, "parent kept changing during recount")
            return
        self.stats.checked += 1
        finding = self.judge(rule, key, snapshot, group)
        if finding is None:
            self.stats.consistent += 1
            return
        repaired = self.repair(rule, key, snapshot, finding)
        if repaired is None:
            # Step 3's fence failed: a legitimate write moved the parent. Re-verify.
            if retry_fence:
                self.verify_parent(rule, key, group, retry_fence=False)
                return
            repaired = finding.with_repair(
                Repair("failed", "the parent changed during repair twice; a recheck will follow")
            )
            self.schedule_recheck(rule, key, 0, "repair fence failed twice")
        self.report(repaired)

    def settled_recount(self, rule: TallyRule, key: Key) -> Snapshot | None:
        """A count that is a true snapshot, or None when the parent never held still.

        With a revision, one settled read suffices: writers bump it with every counter
        change, so an A->B->A change cannot pass. Without one, drift is only called when
        two settled reads agree.
        """
        agreed: Snapshot | None = None
        for attempt in range(self.settle.attempts):
            if attempt:
                time.sleep(random.uniform(0, self.settle.pause_seconds * 2**attempt))
            before = self.table.read_parent(rule, key)
            tally = self.table.tally_children(rule, key)
            after = self.table.read_parent(rule, key)
            if not before.same_as(after):
                agreed = None
                continue
            snapshot = Snapshot(after, tally)
            if rule.revision is not None or not _drifted(rule, snapshot):
                return snapshot
            if agreed is not None and agreed == snapshot:
                return Snapshot(after, tally, confirmations=2)
            agreed = snapshot
        return None

    def judge(
        self, rule: TallyRule, key: Key, snapshot: Snapshot, group: Group | None
    ) -> Finding | None:
        parent, tally = snapshot.parent, snapshot.tally
        details = []
        if snapshot.confirmations == 2:
            details.append("no revision attribute: confirmed by two agreeing settled reads")
        if tally.unreadable:
            details.append(f"{len(tally.unreadable)} children hold a non-number and count 0")
        if not parent.exists:
            if tally.children == 0:
                return None
            kind: Kind = "orphans"
            stored: Any = None
            actual: Any = Decimal(tally.children)
        else:
            stored, actual = parent.counter, tally.actual
            if not _valid_counter(rule, stored):
                kind = "invalid_counter"
            elif (stored if stored is not None else Decimal(0)) == actual:
                return None
            else:
                kind = "ttl_removal" if group is not None and group.ttl_removed else "drift"
        return Finding(
            kind=kind,
            rule=rule.name,
            table=self.table.name,
            key=key,
            attribute=rule.counter,
            stored=stored,
            actual=actual,
            evidence=tuple(group.evidence) if group else (),
            detail="; ".join(details),
            revision=parent.revision,
            first_seen=group.first_seen if group else None,
        )

    # --- step 3: repair ----------------------------------------------------------------

    def repair(
        self, rule: TallyRule, key: Key, snapshot: Snapshot, finding: Finding
    ) -> Finding | None:
        """The finding with its repair outcome, or None when the fence failed."""
        if finding.kind == "orphans":
            return finding.with_repair(
                Repair("skipped", "orphaned children are never deleted automatically")
            )
        verdict = self.policy.verdict(rule, finding.stored, finding.actual)
        if verdict is not None:
            return finding.with_repair(verdict)
        repair = Repair(
            "applied", "counter set to the settled recount", finding.stored, finding.actual
        )
        log = self.store.repair_put(finding, repair)
        if not self.table.set_counter(
            rule, key, snapshot.parent, finding.actual, finding.finding_id, log
        ):
            return None
        self._drift_lived(finding)
        return finding.with_repair(repair)

    def apply_ttl_expiries(self, rule: TallyRule, group: Group) -> None:
        """Rules that treat TTL expiry as a decrement: apply each exactly once."""
        if not group.expiries:
            return
        if not self.policy.enabled or self.policy.dry_run:
            # No writes allowed: let the expiries count as removals, so they surface.
            group.child_delta -= sum(e.delta for e in group.expiries)
            group.ttl_removed = True
            group.expiries.clear()
            return
        for expiry in group.expiries:
            marker = self.store.ttl_marker_put(expiry.event_id)
            if self.table.decrement(rule, group.parent_key, expiry.delta, marker, expiry.event_id):
                self.stats.ttl_decrements += 1
        group.expiries.clear()

    # --- step 4: gaps --------------------------------------------------------------------

    def schedule_recheck(
        self, rule: TallyRule | SequenceRule, key: Key, counter_seen: int, reason: str
    ) -> None:
        delay = rule.grace_seconds if isinstance(rule, SequenceRule) else self.settle.defer_seconds
        self.rechecks.schedule(Recheck(rule.name, key, counter_seen, reason), delay)
        self.stats.rechecks += 1

    def recheck(self, recheck: Recheck) -> None:
        """The authoritative check of one parent or sequence, after its grace period."""
        rule = self.rules[recheck.rule]
        key = dict(recheck.key)
        if not isinstance(rule, SequenceRule):
            self.verify_parent(rule, key, None)
            return
        watermark = self.store.watermark(rule.name, key)
        counter = self.table.read_parent(rule, key)
        members = self.table.member_numbers(rule, key, above=watermark)
        held = Counter(number for number, _ in members)
        highest = max(held, default=watermark)
        self.stats.checked += 1
        problems = self._counter_findings(rule, key, counter, highest)
        problems += self._duplicate_findings(rule, key, held)
        stored = counter.counter if _valid_counter(rule, counter.counter) else None
        current = int(stored) if stored is not None else 0
        horizon = min(current, recheck.counter_seen) if recheck.counter_seen else current
        for number in range(watermark + 1, horizon + 1):
            if number not in held:
                finding = self._gap(rule, key, number, stored, recheck.reason)
                if finding is None:
                    held[number] += 1  # the member arrived after all: not a gap
                    continue
                if finding.repair and finding.repair.status == "applied":
                    held[number] += 1
                problems.append(finding)
        for finding in problems:
            self.report(finding)
        if not problems:
            self.stats.consistent += 1
        contiguous = watermark
        while contiguous + 1 in held and contiguous + 1 <= horizon:
            contiguous += 1
        if contiguous > watermark:
            self.store.advance_watermark(rule.name, key, contiguous)

    def _counter_findings(
        self, rule: SequenceRule, key: Key, counter: ParentState, highest: int
    ) -> list[Finding]:
        stored = counter.counter
        valid = _valid_counter(rule, stored)
        if valid and int(stored or 0) >= highest:
            return []
        kind: Kind = "counter_behind" if valid else "invalid_counter"
        finding = Finding(
            kind=kind,
            rule=rule.name,
            table=self.table.name,
            key=key,
            attribute=rule.counter,
            stored=stored,
            actual=Decimal(highest),
            revision=counter.revision,
            detail="the next number handed out would collide with a member" if valid else "",
        )
        verdict = self.policy.verdict(rule, stored, Decimal(highest))
        if verdict is not None:
            return [finding.with_repair(verdict)]
        repair = Repair("applied", "counter raised to the highest member", stored, Decimal(highest))
        log = self.store.repair_put(finding, repair)
        if self.table.set_counter(rule, key, counter, Decimal(highest), finding.finding_id, log):
            return [finding.with_repair(repair)]
        # The counter moved (a writer caught up): re-verify on the next recheck.
        self.schedule_recheck(rule, key, 0, "counter moved during repair")
        return []

    def _duplicate_findings(
        self, rule: SequenceRule, key: Key, held: Counter[int]
    ) -> list[Finding]:
        return [
            Finding(
                kind="duplicate",
                rule=rule.name,
                table=self.table.name,
                key=key,
                attribute=rule.counter,
                stored=Decimal(count),
                actual=Decimal(1),
                number=number,
                detail=f"{count} members hold number {number}",
                repair=Repair("skipped", "which member keeps the number is a human decision"),
            )
            for number, count in sorted(held.items())
            if count > 1
        ]

    def _gap(
        self, rule: SequenceRule, key: Key, number: int, stored: Any, reason: str
    ) -> Finding | None:
        """A gap finding with its VOID repair, or None if the member turned up meanwhile."""
        finding = Finding(
            kind="gap",
            rule=rule.name,
            table=self.table.name,
            key=key,
            attribute=rule.counter,
            stored=stored,
            actual=None,
            number=number,
            detail=f"number {number} is missing after the grace period ({reason})",
        )
        verdict = self.policy.verdict(rule, None, "VOID")
        if verdict is not None:
            return finding.with_repair(verdict)
        repair = Repair("applied", "VOID tombstone written", None, "VOID")
        log = self.store.repair_put(finding, repair)
        if not self.table.put_void(rule, key, number, finding.finding_id, log):
            return None
        return finding.with_repair(repair)

    # --- step 5: alerts ------------------------------------------------------------------

    def report(self, finding: Finding) -> None:
        """Store the finding and publish it once; a redelivery finds the claim and stops."""
        repair = finding.repair or Repair("skipped", "no repair attempted")
        finding = finding.with_repair(repair)
        self.stats.findings[finding.kind] += 1
        self.stats.repairs[repair.status] += 1
        self.store.record_finding(finding)
        if self.alerts.publish(finding):
            self.stats.alerts += 1
        self.log.append(finding)

    def _drift_lived(self, finding: Finding) -> None:
        if finding.first_seen:
            born = datetime.fromisoformat(finding.first_seen.replace("Z", "+00:00"))
            self.stats.drift_lifetimes.append((datetime.now(UTC) - born).total_seconds())


def _valid_counter(rule: TallyRule | SequenceRule, value: Any) -> bool:
    if value is None:
        return True  # absent reads as 0
    if not isinstance(value, Decimal) or not value.is_finite():
        return False
    if isinstance(rule, SumRule):
        return True
    return value >= 0 and value == value.to_integral_value()


def _drifted(rule: TallyRule, snapshot: Snapshot) -> bool:
    counter = snapshot.parent.counter
    if not snapshot.parent.exists:
        return snapshot.tally.children > 0
    if not _valid_counter(rule, counter):
        return True
    return (counter if counter is not None else Decimal(0)) != snapshot.tally.actual


def _counter_horizon(group: Group) -> int:
    """Numbers up to here were handed out before this batch ended: judge them after grace."""
    return max([group.counter_seen, *group.inserted])
