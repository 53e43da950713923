"""The verification protocol, top to bottom in the order docs/verification.md describes it.

1. Fast path: a group whose counter deltas equal its child deltas proves itself; no read.
   Carry: a hot parent's remainder waits in the audit table for the batch that cancels it
   (a transaction split by the batch boundary), balanced or not; one that persists past the
   window is recounted. Small parents are recounted at once.
2. Settled recount: read the parent, count or sum the children, read the parent again;
   an unchanged revision makes the count a snapshot. Retry, then defer to a recheck.
   A counter kept by a stream aggregator is judged only after its lag, on an offset that
   held across the lag, and never repaired.
3. Repair: SET the counter to the truth, fenced on the verified counter and revision, in
   one transaction with its log, its marker's record and its alert. A record carrying a
   repair marker is the reconciler's own only if the audit table logged that marker.
4. Gaps: an unbalanced sequence waits out its grace period; the recheck is authoritative.
   A counter that goes down is a finding at once. Members numbered in an attribute are read
   from the member ledger the stream keeps; a number a member gave up is judged again.
5. Alerts: one message per finding through the outbox, de-duplicated by the finding's
   identity and outcome.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError

from tally.core.numbers import (
    counter_problem,
    exact_sum,
    subtract,
)
from tally.reconciler.alerts import AlertPublisher
from tally.reconciler.audit_store import AuditStore
from tally.reconciler.changes import Batch, Group, fold_record, group_records
from tally.reconciler.findings import AlertMessage, Finding, Off, Repair, shown
from tally.reconciler.ledger import MemberLedger
from tally.reconciler.protocol import carry as carrying
from tally.reconciler.protocol import gaps, lifecycle
from tally.reconciler.protocol.batching import item_collections, window_left
from tally.reconciler.protocol.carry import Carry
from tally.reconciler.protocol.judgement import (
    ParentState,
    Tally,
    drifted,
    never_repaired,
    valid_counter,
    valid_revision,
)
from tally.reconciler.protocol.judgement import judge as verdict_on
from tally.reconciler.protocol.lifecycle import Observed
from tally.reconciler.rechecks import Recheck, RecheckQueue
from tally.reconciler.repairs import RepairPolicy
from tally.reconciler.table import TallyTable
from tally.rules import AttributeMembers, CountRule, Key, RuleSet, SequenceRule, SumRule

TallyRule = CountRule | SumRule
# Missing runs longer than this are one summarised finding: voiding 10^9 numbers one by
# one is no repair (the counter jump itself is the fault).
MAX_VOIDS_PER_GAP = 100
# Count parents up to this many children are recounted at once instead of carried: a
# consistent Select=COUNT over 100 small (~40 byte) children reads about 1 RCU, so the
# recount (about 3 RCU) costs less than the carry's read, write (1 WCU, priced as 5 RCU) and
# later recheck, and leaves no state behind.
SMALL_PARENT = 100
# Open carries this process knows of, kept across warm invocations (a hint: one forgotten
# costs a recount after its window, never a finding). Past this many, the hint starts over.
MAX_OPEN_CARRIES = 10_000
# How long a carry's write may still land after its recheck was scheduled: the write's
# bounded retries (3 attempts of at most 3 + 15 s) with room to spare.
CARRY_WRITE_MS = 60_000
CarryId = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Settle:
    """How hard step 2 tries before it defers to a recheck."""

    attempts: int = 4
    pause_seconds: float = 0.05
    # A parent too busy to hold still is looked at again later, not hammered: a hot parent
    # would otherwise cost a full recount per retry for as long as it stays hot.
    defer_seconds: int = 30


@dataclass(frozen=True)
class Deadline:
    """When to stop starting groups: the invocation's time left, and what to keep in hand."""

    remaining_seconds: Callable[[], float]
    reserve_seconds: float = 20.0

    def near(self) -> bool:
        return self.remaining_seconds() < self.reserve_seconds


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
    ttl_decrements: int = 0
    alerts: int = 0
    findings: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    drift_lifetimes: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def merge(self, other: Stats) -> None:
        """Add what ``other`` counted (one item collection's share of a batch)."""
        for name, value in vars(other).items():
            if isinstance(value, Counter):
                getattr(self, name).update(value)
            elif isinstance(value, list):
                getattr(self, name).extend(value)
            else:
                setattr(self, name, getattr(self, name) + value)


@dataclass(frozen=True)
class Repairing:
    """One repair write in the making: its marker and what commits with it."""

    marker: str
    logged: list[dict[str, Any]]
    message: AlertMessage


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
        remind_seconds: int = 0,
        ledger: MemberLedger | None = None,
        carry_seconds: int = 5,
        open_carries: set[CarryId] | None = None,
        carrying: bool = True,
        concurrency: int = 1,
    ):
        self.rules = rules
        self.table = table
        self.store = store
        self.alerts = alerts
        self.rechecks = rechecks
        self.policy = policy
        self.settle = settle or Settle()
        self.remind_seconds = remind_seconds
        # False for an operator's dry run that only shows findings: nothing recorded or sent.
        self.alerting = True
        self._ledger = ledger
        self.carry_seconds = carry_seconds
        # False for a replay (its records may be older than what the carry already folded)
        # and under a ParallelizationFactor above 1 (an item collection's records may arrive
        # out of order in concurrent batches).
        self.carrying = carrying
        self.open_carries = open_carries if open_carries is not None else set()
        # Set by an inline full audit: orphans' second looks wait in the audit, not the queue.
        self.inline_rechecks: list[tuple[Recheck, int]] | None = None
        # Item collections of one batch verified at once (each waits mostly on the table).
        self.concurrency = max(1, concurrency)
        self._stats = Stats()
        self._local = threading.local()
        self._ledger_lock = threading.Lock()
        self._stopping = threading.Event()  # set by an interrupt: no further group starts
        self.log: list[Finding] = []
        # Every parent found off, alerted now or standing from before: the audit's whole state.
        self.off: list[Off] = []

    @property
    def stats(self) -> Stats:
        """What this invocation did; inside a concurrent item collection's work, its share."""
        share: Stats | None = getattr(self._local, "stats", None)
        return self._stats if share is None else share

    @property
    def ledger(self) -> MemberLedger:
        """The member ledger (attribute-layout sequences), made on first use."""
        with self._ledger_lock:
            if self._ledger is None:
                self._ledger = MemberLedger(self.store.client, self.store.table_name)
        return self._ledger

    def verify_batch(self, records: Iterable[Any], deadline: Deadline | None = None) -> list[str]:
        """Verify one stream batch; return the sequence numbers to report as failed."""
        batch = group_records(records, self.rules)
        self.stats.records += batch.records
        self.stats.skipped += batch.skipped
        self.stats.malformed += len(batch.malformed)
        self.settle_claims(batch, deadline)
        collections = item_collections(
            (g for g in batch.groups.values() if g.rule.repair != "off"),
            self.rules.table.partition_key,
        )
        failed: list[str] = []
        looked = False
        for collection_failed, collection_looked in self._each_collection(collections, deadline):
            failed += collection_failed
            looked = looked or collection_looked
        if looked and not (deadline is not None and deadline.near()):
            self.flush_alerts()
        return sorted(failed, key=int)

    def _each_collection(
        self, collections: list[list[Group]], deadline: Deadline | None
    ) -> Iterator[tuple[list[str], bool]]:
        """Verify each item collection's groups in order, up to ``concurrency`` collections
        at once: groups of one collection share items (a parent, its sequence, its carry),
        groups of different collections share nothing but this invocation's totals."""
        # Collections that prove themselves read nothing: a worker would cost more than they.
        here: list[list[Group]] = []
        waiting: list[list[Group]] = []
        for groups in collections:
            needs_table = self.concurrency > 1 and not self._needs_no_table(groups)
            (waiting if needs_table else here).append(groups)
        if len(waiting) <= 1:  # one alone gains nothing from a worker either
            here, waiting = here + waiting, []
        for groups in here:
            yield self._verify_collection(groups, deadline)
        if not waiting:
            return
        workers = min(self.concurrency, len(waiting))
        pool = ThreadPoolExecutor(workers, thread_name_prefix="verify")
        try:
            shares = [pool.submit(self._counted, groups, deadline) for groups in waiting]
            for future in shares:
                outcome, stats = future.result()
                self._stats.merge(stats)
                yield outcome
        except BaseException:
            # An interrupt (a local pump's second Ctrl-C): no collection or group starts any
            # more; the groups under way end, and the batch is delivered again as a whole.
            self._stopping.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()

    def _counted(
        self, groups: list[Group], deadline: Deadline | None
    ) -> tuple[tuple[list[str], bool], Stats]:
        self._local.stats = Stats()
        try:
            return self._verify_collection(groups, deadline), self._local.stats
        finally:
            self._local.stats = None

    def _verify_collection(
        self, groups: list[Group], deadline: Deadline | None
    ) -> tuple[list[str], bool]:
        failed, looked = [], False
        for group in groups:
            if self._stopping.is_set():
                failed.append(group.first_sequence_number)
                continue
            if deadline is not None and deadline.near():
                # Better a retried group than a lost partial batch response.
                failed.append(group.first_sequence_number)
                self.stats.errors.append(f"{group.rule.name} {group.parent_key}: out of time")
                continue
            self.stats.groups += 1
            try:
                looked = self.verify_group(group) or looked
            except Exception as error:
                looked = True  # the alert of a repair that committed may wait in the outbox
                # Throttling or an outage mid-check: retry this group's records, only them.
                failed.append(group.first_sequence_number)
                where = f"{group.rule.name} {group.parent_key}"
                self.stats.errors.append(f"{where}: {type(error).__name__}: {error}")
        return failed, looked

    def proves_itself(self, group: Group) -> bool:
        """Step 1: a balanced batch proves that nothing new drifted: zero reads. One that may
        hold the other half of an open remainder (its first records) is folded into it."""
        return group.balanced and not (
            self.open_carries and group.carriable and self._open(group.rule, group.parent_key)
        )

    def _needs_no_table(self, groups: list[Group]) -> bool:
        """A collection whose every group proves itself, with no TTL expiry to apply and no
        ledger change to record: verified where it stands, no worker needed."""
        return all(
            not group.expiries and not group.ledger and self.proves_itself(group)
            for group in groups
        )

    def verify_group(self, group: Group) -> bool:
        """Verify one group; True when it went past the stream to the table."""
        rule = group.rule
        if isinstance(rule, CountRule | SumRule):
            self.apply_ttl_expiries(rule, group)
        elif group.ledger:
            # Before any judgement: a later recheck reads the members from the ledger.
            self.ledger.record(rule, group.parent_key, group.ledger)
        if self.proves_itself(group):
            self.stats.balanced += 1
            self.stats.checked += 1
            self.stats.consistent += 1
            return False
        if not isinstance(rule, SequenceRule) and rule.lag_seconds is not None:
            # Not judged yet: the aggregator may still be adding this batch's deltas.
            self.schedule_recheck(rule, group.parent_key, 0, "aggregated counter unbalanced")
            return True
        if isinstance(rule, SequenceRule):
            self.report_decreases(rule, group)
            if group.parent_removed:
                self.store.end_sequence(rule.name, group.parent_key)
            elif group.lowest_given_up is not None:
                # A number no longer held is judged again, wherever the watermark stood.
                self.store.lower_watermark(rule.name, group.parent_key, group.lowest_given_up - 1)
            # Step 4: not a gap yet; the increment and its put may sit in different batches.
            # A number given up was handed out long ago: judged even if the counter stood still.
            # Numbers that went away with their counter item are no gaps: if the key is used
            # again before the recheck, they are the new counter's to hand out.
            horizon = 0 if group.parent_removed else max(group.horizon, group.highest_given_up)
            self.schedule_recheck(rule, group.parent_key, horizon, "unbalanced")
            return True
        first: ParentState | None = None
        if group.carriable and self.carrying:
            small, first = self.small_parent(rule, group)
            if not small and self.carry(rule, group):
                return False
        self.verify_parent(rule, group.parent_key, group, first=first)
        return True

    # --- step 1b: carry ------------------------------------------------------------------

    def small_parent(self, rule: TallyRule, group: Group) -> tuple[bool, ParentState | None]:
        """Is a recount cheaper than the carry? With the parent's read, when it took one.

        A count parent's size is its counter as the batch found it, before its first write:
        a rogue write of a large value does not make a small parent look hot. A group of
        child records only reads the counter (that read then opens the recount). A sum says
        nothing of its children's number: one bounded ``Select=COUNT`` tells.
        """
        if not isinstance(rule, CountRule):
            return not self.table.has_more_children(rule, group.parent_key, SMALL_PARENT), None
        if group.counter_before is not None:
            return group.counter_before <= SMALL_PARENT, None
        state = self.table.read_parent(rule, group.parent_key)
        counter = state.counter if state.counter is not None else Decimal(0)
        if not state.exists or not valid_counter(rule, counter):
            return True, state  # orphans or a broken counter: the recount reports it now
        return counter <= SMALL_PARENT, state

    def carry(self, rule: TallyRule, group: Group) -> bool:
        """Fold the group's remainder into the parent's carry; False: recount instead.

        Only records past the carry's ``through`` are added, so redelivery, bisection and
        retries never add one twice. A remainder that cancels out is balanced; one that
        becomes non-zero is recounted by a recheck after the window unless a later batch
        cancels it first. A concurrent writer of the carry (the write is fenced) sends the
        group to the recount.
        """
        key = group.parent_key
        previous = self.store.carry(rule.name, key)
        through = max(int(number) for number in group.sequence_numbers)
        folded = carrying.fold(previous, through, group.deltas, _now_ms(), group.first_seen)
        if folded.outcome == "folded before":
            self.stats.carried += 1  # a remainder has its recheck scheduled
            return True
        if folded.carry is None:
            return False  # more digits than the audit table holds: recount instead
        carry = folded.carry
        if folded.outcome == "opened":
            # Scheduled before the write: a carry never stands without its recheck. The window
            # runs from the records' stream time: time spent reaching this batch is not added.
            delay = window_left(group.first_at, time.time(), self.carry_seconds)
            self.schedule_recheck(
                rule,
                key,
                0,
                "carried remainder",
                carry_since=carry.since,
                delay=delay,
                carry_through=carry.through,
            )
        if not self.store.put_carry(rule.name, key, previous, carry):
            return False
        self._note_carry(rule, key, carry)
        if carry.remainder:
            self.stats.carried += 1
        else:
            self.stats.balanced += 1
            self.stats.checked += 1
            self.stats.consistent += 1
        return True

    def recheck_carry(self, rule: TallyRule, key: Key, since: int, through: int = 0) -> bool:
        """The window passed: recount a remainder nothing cancelled, then take off what the
        recount covered (the records up to the ``through`` it read). True if it recounted.

        The recheck is scheduled before its carry is written: one that finds the carry
        still short of the records it names (``through``) overtook a slow write, and comes
        back a window later, for as long as the write could still be under way."""
        seen = self.store.carry(rule.name, key)
        if seen.since != since:
            if through and seen.through < through and _now_ms() - since < CARRY_WRITE_MS:
                self.schedule_recheck(
                    rule,
                    key,
                    0,
                    "carried remainder not written yet",
                    carry_since=since,
                    delay=self.carry_seconds,
                    carry_through=through,
                )
            return False  # cancelled meanwhile, or a later remainder with its own recheck
        self.verify_parent(rule, key, None, first_seen=seen.first_seen)
        for _ in range(self.settle.attempts):
            now = self.store.carry(rule.name, key)
            if now.since != since:
                return True  # cancelled meanwhile: nothing is left to take off
            carry = carrying.take_off(seen, now, _now_ms())
            if carry is None:
                # Too many digits to carry: a recount now covers every record folded so far.
                self.verify_parent(rule, key, None, first_seen=seen.first_seen)
                carry = Carry(Decimal(0), now.through)
            if self.store.put_carry(rule.name, key, now, carry):
                if carry.remainder:  # records folded since the read: their own window
                    self.schedule_recheck(
                        rule, key, 0, "carried remainder", carry_since=carry.since
                    )
                return True
        self.schedule_recheck(rule, key, 0, "the carry kept moving", carry_since=since)
        return True

    def _open(self, rule: TallyRule | SequenceRule, key: Key) -> bool:
        return (rule.name, tuple(sorted(key.items()))) in self.open_carries

    def _note_carry(self, rule: TallyRule, key: Key, carry: Carry) -> None:
        name = (rule.name, tuple(sorted(key.items())))
        if not carry.remainder:
            self.open_carries.discard(name)
            return
        if len(self.open_carries) >= MAX_OPEN_CARRIES:
            self.open_carries.clear()
        self.open_carries.add(name)

    # --- step 2: settled recount ---------------------------------------------------------

    def verify_parent(
        self,
        rule: TallyRule,
        key: Key,
        group: Group | None,
        *,
        retry_fence: bool = True,
        first: ParentState | None = None,
        first_seen: str | None = None,
        observed: Observed | None = None,
    ) -> None:
        """Recount one parent (``first``: its read already taken); repair and report.

        ``observed``: the orphans an earlier look saw (children without their parent).
        """
        snapshot = self.settled_recount(rule, key, first)
        if snapshot is None:
            self.stats.deferred += 1
            self.schedule_recheck(rule, key, 0, "parent kept changing during recount")
            return
        self.stats.checked += 1
        self.report_malformed(rule, key, snapshot.tally)
        finding = self.judge(rule, key, snapshot, group, first_seen)
        if finding is None:
            self.stats.consistent += 1
            if not self.policy.writes(rule):
                self.store.clear_standing(rule.name, key)  # a drift that returns is news
            return
        if finding.kind == "orphans":
            self.judge_orphans(rule, key, finding, observed)
            return
        if group is not None and lifecycle.emptied(
            rule.orphan_grace_seconds,
            finding.kind,
            finding.actual,
            group.counter_delta,
            (e.event for e in group.evidence),
        ):
            # Every child went away and nothing else moved: a deletion that takes the
            # children first and the parent next (a BatchWriteItem is no transaction).
            self.look_again(rule, key, finding, "emptied: waiting for a cascade")
            return
        if self.repair(rule, key, snapshot, finding):
            return
        # Step 3's fence failed: a legitimate write moved the parent. Re-verify.
        if retry_fence:
            self.verify_parent(rule, key, group, retry_fence=False, first_seen=first_seen)
            return
        self.report(
            finding.with_repair(
                Repair("failed", "the parent changed during repair twice; a recheck will follow")
            )
        )
        self.schedule_recheck(rule, key, 0, "repair fence failed twice")

    def judge_orphans(
        self,
        rule: TallyRule | SequenceRule,
        key: Key,
        finding: Finding,
        observed: Observed | None,
        counter_seen: int = 0,
    ) -> None:
        """Children (or members) without their parent: a cascade deleting them is normal, so
        they are a finding only once the same ones were seen a grace period apart. Alert-only:
        no parent (or counter item) is ever created for them."""
        if rule.orphan_grace_seconds and not lifecycle.same(observed, _observation(finding)):
            self.look_again(rule, key, finding, "orphans: waiting for a cascade", counter_seen)
            return
        why = "the reconciler never creates a parent or counter item, nor deletes children"
        self.report(finding.with_repair(Repair("skipped", why)))

    def look_again(
        self,
        rule: TallyRule | SequenceRule,
        key: Key,
        finding: Finding,
        reason: str,
        counter_seen: int = 0,
    ) -> None:
        """What a cascade may still change is judged on a second look, ``orphan_grace_seconds``
        later, carrying what this look saw."""
        self.off.append(Off(finding, "unconfirmed"))
        seen, delay = _observation(finding), rule.orphan_grace_seconds
        self.schedule_recheck(rule, key, counter_seen, reason, seen, delay=delay)

    def settled_recount(
        self, rule: TallyRule, key: Key, first: ParentState | None = None
    ) -> Snapshot | None:
        """A count that is a true snapshot, or None when the parent never held still.

        With a revision, one settled read suffices: writers bump it with every counter
        change, so an A->B->A change cannot pass. Without one, drift is only called when
        two settled reads agree.
        """
        agreed: Snapshot | None = None
        for attempt in range(self.settle.attempts):
            if attempt:
                time.sleep(random.uniform(0, self.settle.pause_seconds * 2**attempt))
            before = first if first and not attempt else self.table.read_parent(rule, key)
            tally = self.table.tally_children(rule, key)
            after = self.table.read_parent(rule, key)
            if not before.same_as(after):
                agreed = None
                continue
            snapshot = Snapshot(after, tally)
            if rule.revision is not None or not drifted(rule, after, tally):
                return snapshot
            if agreed is not None and agreed == snapshot:
                return Snapshot(after, tally, confirmations=2)
            agreed = snapshot
        return None

    def judge(
        self,
        rule: TallyRule,
        key: Key,
        snapshot: Snapshot,
        group: Group | None,
        first_seen: str | None = None,
    ) -> Finding | None:
        verdict = verdict_on(
            rule,
            snapshot.parent,
            snapshot.tally,
            confirmations=snapshot.confirmations,
            ttl_removed=group is not None and group.ttl_removed,
        )
        if verdict is None:
            return None
        stored = verdict.stored
        if verdict.kind == "invalid_counter":
            stored = shown(stored)  # by type and size, never the value
        return Finding(
            kind=verdict.kind,
            rule=rule.name,
            table=self.table.name,
            key=key,
            attribute=verdict.attribute,
            stored=stored,
            actual=verdict.actual,
            evidence=tuple(group.evidence) if group else (),
            detail="; ".join(verdict.details),
            revision=snapshot.parent.revision,
            first_seen=group.first_seen if group else first_seen,
        )

    def report_malformed(self, rule: TallyRule, key: Key, tally: Tally) -> None:
        """A child whose amount is not a number counts 0: each is a finding of its own, by its
        key, attribute and type (never its value), never repaired."""
        if not isinstance(rule, SumRule):
            return
        for child, kind in tally.unreadable:
            self.report(
                Finding(
                    kind="malformed",
                    rule=rule.name,
                    table=self.table.name,
                    key=dict(child),
                    attribute=rule.summed,
                    stored=kind,
                    actual=None,
                    detail=f"the amount holds {kind}, not a number: the sum of "
                    f"{_key_text(key)} counts it as 0",
                    repair=Repair("skipped", "what the amount should be is a human decision"),
                )
            )

    # --- step 2, asynchronous counters: judged after the lag -------------------------------

    def verify_aggregated(self, rule: TallyRule, key: Key, observed: Observed | None) -> None:
        """Judge a counter a stream aggregator keeps: a finding only if it held across the lag.

        Whatever deltas were pending at one recount have landed a lag later, so an offset
        (stored - actual) seen again a lag later, on an unchanged parent, is no lag. An offset
        that moved was moved by stream records, whose batches recheck it again. Never
        repaired: a write would race the aggregator's pending deltas.
        """
        snapshot = self.settled_recount(rule, key)
        if snapshot is None:
            self.stats.deferred += 1
            self.schedule_recheck(rule, key, 0, "parent kept changing during recount", observed)
            return
        self.stats.checked += 1
        finding = self.judge(rule, key, snapshot, None)
        if finding is None:
            self.stats.consistent += 1
            self.store.clear_standing(rule.name, key)  # a drift that returns is news
            return
        seen = _observation(finding)
        if finding.kind != "invalid_counter" and not lifecycle.same(observed, seen):
            self.off.append(Off(finding, "unconfirmed"))
            if observed is None or lifecycle.offset(observed) == lifecycle.offset(seen):
                # First sight, or the offset held while the parent moved: look a lag later.
                self.schedule_recheck(rule, key, 0, "aggregated counter off after its lag", seen)
            # Otherwise the offset moved, and the records that moved it bring their rechecks.
            return
        held = f"the same counter and truth {rule.lag_seconds} s apart: not the aggregator's lag"
        detail = "; ".join(part for part in (finding.detail, held) if part)
        why = "a counter kept by a stream aggregator is never repaired: it would race the deltas"
        self.report(replace(finding, detail=detail).with_repair(Repair("skipped", why)))

    # --- step 3: repair ------------------------------------------------------------------

    def repair(self, rule: TallyRule, key: Key, snapshot: Snapshot, finding: Finding) -> bool:
        """Repair and report the finding; False when the fence failed (nothing written)."""
        never = never_repaired(rule, finding.kind, finding.attribute, finding.revision)
        if never:
            self.report(finding.with_repair(Repair("skipped", never)))
            return True
        verdict = self.policy.verdict(rule, finding.stored, finding.actual)
        if verdict is not None:
            self.report(finding.with_repair(verdict))
            return True
        repaired = finding.with_repair(
            Repair("applied", "counter set to the settled recount", finding.stored, finding.actual)
        )
        work = self.repairing(repaired, key, {rule.counter: finding.actual})
        if not self.table.set_counter(
            rule, key, snapshot.parent, finding.actual, work.marker, work.logged
        ):
            return False
        self._drift_lived(finding)
        self.announce(repaired, work.message)
        return True

    def repairing(self, finding: Finding, target: Key, written: dict[str, Any]) -> Repairing:
        """A fresh marker for the write of ``written`` on ``target``, and the audit items that
        commit with it: the repair log, the marker's record, the finding, the end of its
        standing, the alert."""
        marker = f"r:{secrets.token_hex(12)}"
        message = AlertMessage.of(finding, finding.alert_id(marker))
        logged = [
            self.store.repair_put(finding, finding.repair or Repair("applied", "")),
            self.store.marker_put(marker, target, written),
            self.store.finding_put(finding),
            self.store.standing_delete(finding),
            self.store.outbox_put(message),
        ]
        return Repairing(marker, logged, message)

    def settle_claims(self, batch: Batch, deadline: Deadline | None = None) -> None:
        """Records with a fresh repair marker: ours only if the audit table logged the marker.

        Any client can write the marker attribute, so a forged or replayed one is folded
        like any other write; an unconfirmable claim is folded too (at worst a recount).
        """
        for claim in batch.claims:
            if deadline is not None and deadline.near():
                fold_record(batch, claim.record, self.rules, claimed=True)  # a recount at worst
                continue
            new_image = claim.record["dynamodb"].get("NewImage") or {}
            try:
                own = self.store.confirm_marker(
                    claim.marker, claim.keys, new_image, claim.sequence_number
                )
            except ClientError as error:
                self.stats.errors.append(f"marker {claim.marker}: {error}")
                own = False
            if own:
                batch.own_writes += 1
            else:
                fold_record(batch, claim.record, self.rules, claimed=True)
        self.stats.own_writes += batch.own_writes

    def apply_ttl_expiries(self, rule: TallyRule, group: Group) -> None:
        """Rules that treat TTL expiry as a decrement: apply each exactly once."""
        if not group.expiries:
            return
        refused = []
        if not self.policy.enabled or self.policy.dry_run or group.parent_removed:
            # No writes allowed, or the parent was removed (and perhaps made again) in this
            # batch: its new life owes these children nothing. They count as removals.
            refused = group.expiries
        else:
            for expiry in group.expiries:
                marker = f"ttl:{expiry.event_id}"
                logged = self.store.marker_put(marker, group.parent_key)
                outcome = self.table.decrement(rule, group.parent_key, expiry.delta, marker, logged)
                if outcome == "applied":
                    self.stats.ttl_decrements += 1
                elif outcome == "refused":
                    refused.append(expiry)
        # Removals the table did not take as decrements surface through the recount.
        group.child_delta = subtract(group.child_delta, exact_sum(e.delta for e in refused))
        group.ttl_removed = group.ttl_removed or bool(refused)
        group.expiries = []

    # --- step 4: gaps --------------------------------------------------------------------

    def schedule_recheck(
        self,
        rule: TallyRule | SequenceRule,
        key: Key,
        counter_seen: int,
        reason: str,
        observed: Observed | None = None,
        carry_since: int = 0,
        delay: int | None = None,
        carry_through: int = 0,
    ) -> None:
        if delay is None:
            delay = self._recheck_delay(rule, carry_since)
        epoch = 0
        if isinstance(rule, SequenceRule) and counter_seen:
            epoch = self.store.sequence_state(rule.name, key)[1]  # the horizon's life
        recheck = Recheck(
            rule.name, key, counter_seen, reason, observed, carry_since, epoch, carry_through
        )
        if self.inline_rechecks is not None and reason in _INLINE_REASONS:
            self.inline_rechecks.append((recheck, delay))  # the full audit waits them out
            return
        self.rechecks.schedule(recheck, delay)
        self.stats.rechecks += 1

    def _recheck_delay(self, rule: TallyRule | SequenceRule, carry_since: int) -> int:
        if isinstance(rule, SequenceRule):
            return rule.grace_seconds
        if carry_since:
            return self.carry_seconds
        return rule.lag_seconds or self.settle.defer_seconds

    def report_decreases(self, rule: SequenceRule, group: Group) -> None:
        """A sequence never goes backwards: a decrease is a finding now, even if healed later."""
        for evidence in group.decreases:
            self.report(
                Finding(
                    kind="counter_behind",
                    rule=rule.name,
                    table=self.table.name,
                    key=group.parent_key,
                    attribute=rule.counter,
                    stored=evidence.new,
                    actual=evidence.old,
                    evidence=(evidence,),
                    detail=f"the counter went down from {evidence.old} to {evidence.new}",
                    occurrence=evidence.sequence_number,
                    first_seen=group.first_seen,
                    repair=Repair("skipped", "the recheck raises the counter over its members"),
                )
            )

    def recheck(self, recheck: Recheck) -> None:
        """The authoritative check of one parent or sequence, after its grace period.

        Members are read before the counter, so a number allocated meanwhile can only make
        the counter look ahead, never behind; gaps are judged only up to the horizon the
        recheck carries (numbers handed out at least a grace period ago).
        """
        rule = self.rules[recheck.rule]
        key = dict(recheck.key)
        if not isinstance(rule, SequenceRule):
            if rule.lag_seconds is not None:
                # Never carried; a carry recheck left from before the lag was set is judged too.
                self.verify_aggregated(rule, key, recheck.observed)
            elif recheck.carry_since:
                if not self.recheck_carry(rule, key, recheck.carry_since, recheck.carry_through):
                    return  # nothing left to recount: no read beyond the carry's
            else:
                self.verify_parent(rule, key, None, observed=recheck.observed)
            self.flush_alerts()
            return
        watermark, epoch = self.store.sequence_state(rule.name, key)
        if recheck.epoch != epoch:
            # The counter item was removed since the horizon was seen: its numbers belong to
            # an earlier life of the key, and the new one's are judged from its own batches.
            recheck = replace(recheck, counter_seen=0, epoch=epoch)
        members = self.member_numbers(rule, key, above=watermark)
        counter = self.table.read_parent(rule, key)
        self.stats.checked += 1
        anchor = self.sequence_anchor(rule, key, counter, watermark, members, recheck)
        if anchor is None:
            self.flush_alerts()
            return
        held = Counter(number for number, _ in members)
        found = 0
        if rule.has_counter:
            found += self.report_counter(rule, key, counter, max(held, default=watermark), recheck)
        found += self.report_duplicates(rule, key, held)
        for low, high in gaps.missing_runs(watermark, recheck.counter_seen, held):
            reported = self.report_gap(rule, key, low, high, counter.counter, recheck, held, anchor)
            if reported is None:
                break  # the sequence went away meanwhile: nothing more is judged under it
            found += reported
        if not found:
            self.stats.consistent += 1
        contiguous = gaps.contiguous(watermark, held)
        if contiguous > watermark:
            self.store.advance_watermark(rule.name, key, contiguous)
        self.flush_alerts()

    def sequence_anchor(
        self,
        rule: SequenceRule,
        key: Key,
        counter: ParentState,
        watermark: int,
        members: list[tuple[int, Key]],
        recheck: Recheck,
    ) -> Key | None:
        """The item whose existence justifies judging (and voiding) numbers: the counter item,
        or without a counter the highest member. None: the sequence is not there to judge.

        A counter item that is gone is no horizon: numbers that went away with it are no
        gaps. Members it left behind are judged like orphans, once they persist; a sequence
        gone with all its members starts again from its first number if its key is reused.
        """
        if rule.has_counter and counter.exists:
            return key
        # Real members only: a VOID tombstone is the reconciler's own, no sign of life.
        remaining = self.member_numbers(rule, key, watermark, voids=False) if members else []
        if not remaining and watermark:
            remaining = self.member_numbers(rule, key, 0, voids=False)
        if not remaining:
            if watermark:
                self.store.lower_watermark(rule.name, key, 0)
            self.stats.consistent += 1
            return None
        if not rule.has_counter:
            return max(remaining)[1]
        count = len(remaining)
        finding = Finding(
            kind="counter_behind",
            rule=rule.name,
            table=self.table.name,
            key=key,
            attribute=rule.counter,
            stored=None,
            actual=Decimal(max(remaining)[0]),
            detail=f"the counter item does not exist; {count} members remain",
        )
        self.judge_orphans(rule, key, finding, recheck.observed, recheck.counter_seen)
        return None

    def member_numbers(
        self, rule: SequenceRule, key: Key, above: int, *, voids: bool = True
    ) -> list[tuple[int, Key]]:
        """Members above ``above``: from the table, or from the ledger (attribute layout).
        ``voids=False``: real members only, not the tombstones the reconciler wrote."""
        if isinstance(rule.members, AttributeMembers):
            return self.ledger.members(rule, key, above)
        return self.table.member_numbers(rule, key, above, voids=voids)

    def sequence_horizon(self, rule: SequenceRule, key: Key) -> Any:
        """The sequence's end as of now: its counter, or (no counter) its highest member."""
        if rule.has_counter:
            return self.table.read_parent(rule, key).counter
        watermark = self.store.watermark(rule.name, key)
        return max((n for n, _ in self.member_numbers(rule, key, watermark)), default=watermark)

    def report_counter(
        self, rule: SequenceRule, key: Key, counter: ParentState, highest: int, recheck: Recheck
    ) -> int:
        stored = counter.counter
        standing = gaps.counter_standing(rule, stored, highest)
        if standing == "ok":
            return 0
        valid = standing == "behind"
        finding = Finding(
            kind="counter_behind" if valid else "invalid_counter",
            rule=rule.name,
            table=self.table.name,
            key=key,
            attribute=rule.counter,
            stored=stored if valid else shown(stored),
            actual=Decimal(highest),
            revision=counter.revision,
            detail="the next number handed out would collide with a member"
            if valid
            else counter_problem(stored, whole=True) or "",
        )
        if not valid:
            why = "the counter holds no number: a repair writes only over a number it judged"
            self.report(finding.with_repair(Repair("skipped", why)))
            return 1
        if rule.revision and not valid_revision(counter.revision):
            revision = replace(
                finding,
                kind="invalid_counter",
                attribute=rule.revision,
                stored=shown(counter.revision),
                revision=None,
            )
            why = never_repaired(rule, revision.kind, revision.attribute, revision.revision)
            self.report(revision.with_repair(Repair("skipped", why)))
            return 1
        verdict = self.policy.verdict(rule, finding.stored, finding.actual)
        if verdict is not None:
            self.report(finding.with_repair(verdict))
            return 1
        repaired = finding.with_repair(
            Repair("applied", "counter raised to the highest member", finding.stored, highest)
        )
        work = self.repairing(repaired, key, {rule.counter: Decimal(highest)})
        if self.table.set_counter(rule, key, counter, Decimal(highest), work.marker, work.logged):
            self.announce(repaired, work.message)
            return 1
        # The counter moved (a writer caught up): look again, over the same horizon.
        self.schedule_recheck(rule, key, recheck.counter_seen, "counter moved during repair")
        return 0

    def report_duplicates(self, rule: SequenceRule, key: Key, held: Counter[int]) -> int:
        duplicated = gaps.duplicates(held)
        for number, count in duplicated:
            self.report(
                Finding(
                    kind="duplicate",
                    rule=rule.name,
                    table=self.table.name,
                    key=key,
                    attribute=rule.counter,
                    stored=Decimal(count),
                    actual=Decimal(1),
                    number=rule.shown_number(number),
                    detail=f"{count} members hold number {rule.shown_number(number)}",
                    repair=Repair("skipped", "which member keeps the number is a human decision"),
                )
            )
        return len(duplicated)

    def report_gap(
        self,
        rule: SequenceRule,
        key: Key,
        low: int,
        high: int,
        stored: Any,
        recheck: Recheck,
        held: Counter[int],
        anchor: Key,
    ) -> int | None:
        """Report the missing run low..high, each number as soon as its repair is decided.

        ``held`` learns the numbers now voided or found, so the watermark can pass them.
        None: the sequence went away (its ``anchor`` is gone): nothing is reported.
        """
        base = Finding(
            kind="gap",
            rule=rule.name,
            table=self.table.name,
            key=key,
            attribute=rule.counter,
            stored=shown(stored),
            actual=None,
            number=rule.shown_number(low),
            detail=f"missing after the grace period ({recheck.reason})",
        )
        if high - low + 1 > MAX_VOIDS_PER_GAP:
            why = f"{high - low + 1} numbers missing: too many to void; look at the counter"
            self.report(
                replace(base, through=rule.shown_number(high), repair=Repair("skipped", why))
            )
            return 1
        reported = 0
        for number in range(low, high + 1):
            finding = replace(base, number=rule.shown_number(number))
            outcome = self.void(rule, key, finding, anchor)
            if outcome == "gone":
                return None
            if outcome != "reported":
                held[number] += 1  # voided, or the member arrived after all
            reported += outcome != "arrived"
        return reported

    def void(self, rule: SequenceRule, key: Key, finding: Finding, anchor: Key) -> str:
        """Void a missing number and report it: "voided", "reported" (no write allowed),
        "arrived" (the member turned up meanwhile: no gap) or "gone" (the sequence went
        away meanwhile: neither a gap nor a write)."""
        verdict = self.policy.verdict(rule, None, "VOID")
        if verdict is None and isinstance(rule.members, AttributeMembers):
            why = "the number is not a member's key: no tombstone can keep it from a late writer"
            verdict = Repair("skipped", why)
        if verdict is not None:
            self.report(finding.with_repair(verdict))
            return "reported"
        assert finding.number is not None
        number = rule.ordinal(finding.number)
        repaired = finding.with_repair(Repair("applied", "VOID tombstone written", None, "VOID"))
        target = self.table.void_key(rule, key, number)
        work = self.repairing(repaired, target, {"void": True})
        outcome = self.table.put_void(rule, key, number, anchor, work.marker, work.logged)
        if outcome != "written":
            return outcome
        self.announce(repaired, work.message)
        return "voided"

    # --- step 5: alerts ------------------------------------------------------------------

    def report(self, finding: Finding) -> None:
        """Alert a finding whose repair wrote nothing, unless it already stands alerted."""
        repair = finding.repair or Repair("skipped", "no repair attempted")
        finding = finding.with_repair(repair)
        if not self.alerting:
            self._count(finding)
            self.off.append(Off(finding, "seen"))  # new or standing: the audit store tells
            return
        message = AlertMessage.of(finding, finding.alert_id(finding.detected_at))
        items = [
            self.store.standing_put(finding, self.remind_seconds),
            self.store.finding_put(finding),
            self.store.outbox_put(message),
        ]
        if self.store.enqueue(items):  # not alerted before: a finding of its own
            self._count(finding)
            self.off.append(Off(finding, "new"))
            self.alerts.send(message)
            self.stats.alerts += 1
        else:
            self.off.append(Off(finding, "seen"))

    def standing_state(self, start: int = 0) -> list[Off]:
        """Every parent found off (from ``off[start]`` on), once each, marked ``new``,
        ``standing`` (with when it was first alerted) or ``unconfirmed``, from the audit
        table's standing slots."""
        latest = {off.finding.finding_id: off for off in self.off[start:]}
        state = []
        for off in latest.values():
            if off.status == "new":
                state.append(off)
                continue
            since = self.store.alerted_at(off.finding)
            if since is not None:
                state.append(Off(off.finding, "standing", since))
            else:
                state.append(Off(off.finding, "new" if off.status == "seen" else off.status))
        return state

    def announce(self, finding: Finding, message: AlertMessage) -> None:
        """Publish the alert an applied repair committed with it."""
        self._count(finding)
        self.off.append(Off(finding, "new"))
        self.alerts.send(message)
        self.stats.alerts += 1

    def flush_alerts(self) -> None:
        """Send what an earlier failure left in the outbox; a failure here waits for the next."""
        if not self.alerting:
            return
        try:
            sent, errors = self.alerts.flush()
        except Exception as error:
            sent, errors = 0, [f"outbox flush: {type(error).__name__}: {error}"]
        self.stats.alerts += sent
        self.stats.errors += errors

    def _count(self, finding: Finding) -> None:
        status = finding.repair.status if finding.repair else "skipped"
        self.stats.findings[finding.kind] += 1
        self.stats.repairs[status] += 1
        self.log.append(finding)

    def _drift_lived(self, finding: Finding) -> None:
        if finding.first_seen:
            born = datetime.fromisoformat(finding.first_seen.replace("Z", "+00:00"))
            self.stats.drift_lifetimes.append((datetime.now(UTC) - born).total_seconds())


# Rechecks an inline full audit waits out itself instead of sending them to the queue.
_INLINE_REASONS = frozenset({"orphans: waiting for a cascade", "emptied: waiting for a cascade"})


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _key_text(key: Key) -> str:
    return "/".join(str(v) for v in key.values())


def _observation(finding: Finding) -> Observed:
    return lifecycle.observation(finding.stored, finding.actual)
