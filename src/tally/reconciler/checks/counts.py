"""Step 2, count and sum verification: a settled recount of one parent (read the parent,
count or sum the children, read the parent again: an unchanged revision makes the count a
snapshot; retry, then defer to a recheck), judged against its counter
(``protocol.judgement``), repaired or reported. Small parents are recounted at once instead
of carried. TTL expiries are applied as decrements. A parent judged a lag or a grace after
its change is left to a recheck here, and judged by ``looks``."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from tally.core.numbers import exact_sum, subtract
from tally.reconciler.checks.followups import Followups
from tally.reconciler.findings import Finding, Repair, malformed_amount, shown
from tally.reconciler.protocol import lifecycle, shards, stamps
from tally.reconciler.protocol.judgement import (
    ChildTotal,
    ParentState,
    drifted,
    valid_counter,
)
from tally.reconciler.protocol.judgement import judge as verdict_on
from tally.reconciler.protocol.lifecycle import Observed
from tally.reconciler.protocol.repair import never_repaired
from tally.reconciler.repair.repairer import Repairer
from tally.reconciler.report.scheduling import EMPTIED
from tally.reconciler.stats import Done, Outcome
from tally.reconciler.store.recent import RecentChildren
from tally.reconciler.stream.changes import Group
from tally.reconciler.table.parent_reads import ParentReads
from tally.rules import CountRule, Key, SumRule, TallyRule

# Count parents up to this many children are recounted at once instead of carried: a
# consistent Select=COUNT over 100 small (~40 byte) children reads about 1 RCU, so the
# recount (about 3 RCU) costs less than the carry's read, write (1 WCU, priced as 5 RCU) and
# later recheck, and leaves no state behind.
SMALL_PARENT = 100


@dataclass(frozen=True)
class Snapshot:
    """A settled read: the parent and its children's truth at one moment."""

    parent: ParentState
    tally: ChildTotal
    confirmations: int = 1


class Counts:
    """Recounts parents of count and sum rules; repairs through the repairer."""

    def __init__(
        self,
        table: ParentReads,
        repairer: Repairer,
        followups: Followups,
        recent: RecentChildren,
    ):
        self._table = table
        self._repairer = repairer
        self._followups = followups
        self._recent = recent

    def remember_children(self, rule: TallyRule, group: Group) -> None:
        """Children found through an index that this batch changed: noted for the rule's
        window, balanced or not, before anything is judged, so that every look until then
        counts them as the stream left them, whatever the index shows."""
        if rule.through is not None and group.indexed_children:
            window = rule.through.window
            self._recent.remember_children(
                rule.name, group.parent_key, group.indexed_children, window
            )

    def measure_parent(self, rule: TallyRule, group: Group) -> tuple[bool, ParentState | None]:
        """Is a recount cheaper than the carry? With the parent's read, when it took one.

        A count parent's size is its counter as the batch found it, before its first write:
        a rogue write of a large value does not make a small parent look hot. A group of
        child records only reads the counter (that read then opens the recount). A sum says
        nothing of its children's number: one bounded ``Select=COUNT`` tells.
        """
        if not isinstance(rule, CountRule):
            return not self._table.has_more_children(rule, group.parent_key, SMALL_PARENT), None
        if group.counter_before is not None:
            return group.counter_before <= SMALL_PARENT, None
        state = self._table.read_parent(rule, group.parent_key)
        counter = state.counter if state.counter is not None else Decimal(0)
        if not state.exists or not valid_counter(rule, counter):
            return True, state  # orphans or a broken counter: the recount reports it now
        return counter <= SMALL_PARENT, state

    def left_to_recheck(self, rule: TallyRule, group: Group) -> Outcome | None:
        """A counter an aggregator keeps, or children found through an index: not judged on
        its batch; its recheck is scheduled (``Outcome.LEFT``), unless every change is a
        stamped writer's own (``Outcome.PROVED``). None: the group is judged now."""
        if rule.lag_seconds is not None:
            # The aggregator may still be adding this batch's deltas: a look a lag later,
            # unless one already on its way will read what this batch wrote.
            self._followups.look_at_aggregated(rule, group.parent_key)
            return Outcome.LEFT
        if rule.through is None:
            return None
        # Child and counter sit in different item collections, on shards with no order
        # between them: no carry. The index may not show this batch's writes yet.
        reason = "children found through an index unbalanced"
        delay, state = rule.through.grace_seconds, group.parent_state
        if rule.through.stamp is not None and group.may_attest:
            changes = group.stamped_children.values()
            parent = self._table.read_parent(rule, group.parent_key) if changes else None
            if stamps.attested(parent.stamps if parent else (), changes):
                return Outcome.PROVED  # docs/verification.md, "Changes that attest themselves"
            if parent is not None:
                state = reference_state(rule, parent)  # read consistently: the look's reference
        if state is None and rule.revision is not None:
            # A batch of children only: the parent as it stands, so that a look a grace later
            # may judge it if it held still. An eventually consistent read may answer an
            # older state; the writers bump the revision with every change, so the look then
            # finds it moved and only looks again. (Without a revision an older counter may
            # come back: such a look reads the parent first, and judges a grace later.)
            parent = self._table.read_parent(rule, group.parent_key, consistent=False)
            state = reference_state(rule, parent)
        self._followups.schedule(rule, group.parent_key, 0, reason, delay=delay, reference=state)
        return Outcome.LEFT

    def verify_parent(
        self,
        rule: TallyRule,
        key: Key,
        group: Group | None,
        done: Done,
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
        finding = self.judged(rule, key, snapshot, group, first_seen, done)
        if snapshot is None or finding is None:
            return
        if finding.kind == "orphans":
            self._followups.judge_orphans(rule, key, finding, observed)
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
            self._followups.look_again(rule, key, finding, EMPTIED)
            return
        if self.repair(rule, key, snapshot, finding):
            return
        # Step 3's fence failed: a legitimate write moved the parent. Re-verify.
        if retry_fence:
            self.verify_parent(rule, key, group, done, retry_fence=False, first_seen=first_seen)
            return
        self._followups.alert(
            finding.with_repair(
                Repair("failed", "the parent changed during repair twice; a recheck will follow")
            )
        )
        self._followups.schedule(rule, key, 0, "repair fence failed twice")

    def judged(
        self,
        rule: TallyRule,
        key: Key,
        snapshot: Snapshot | None,
        group: Group | None,
        first_seen: str | None,
        done: Done,
    ) -> Finding | None:
        """The finding of a settled recount, with what the recount came to in ``done``; none
        when there is nothing more to do (the parent never held still and is deferred, or it
        is consistent)."""
        if snapshot is None:
            done.append(Outcome.DEFERRED)
            self._followups.schedule(rule, key, 0, "parent kept changing during recount")
            return None
        finding = self.finding_of(rule, key, snapshot, group, first_seen)
        done.append(Outcome.CONSISTENT if finding is None else Outcome.CHECKED)
        self.report_malformed(rule, key, snapshot.tally)
        if finding is None and not self._repairer.writes(rule):
            self._followups.consistent(rule, key)  # a drift that returns is news
        return finding

    def recount(self, rule: TallyRule, key: Key, first_seen: str | None, done: Done) -> None:
        """Recount one parent for its carry: the drift dates from the carry's first record."""
        self.verify_parent(rule, key, None, done, first_seen=first_seen)

    def repair(self, rule: TallyRule, key: Key, snapshot: Snapshot, finding: Finding) -> bool:
        """Repair and report the finding; False when the fence failed (nothing written)."""
        never = never_repaired(rule, finding.kind, finding.attribute, finding.revision)
        if never:
            self._followups.skip(finding, never)
            return True
        why = "counter set to the settled recount"
        committed = self._repairer.set_counter(rule, finding, why, snapshot.parent, finding.actual)
        if committed:
            self._followups.repaired(finding)
        return committed is not False

    def settled_recount(
        self, rule: TallyRule, key: Key, first: ParentState | None = None, *, confirm: bool = True
    ) -> Snapshot | None:
        """A count that is a true snapshot, or None when the parent never held still.

        With a revision, one settled read suffices: writers bump it with every counter
        change, so an A->B->A change cannot pass. Without one, drift is only called when
        two settled reads agree. ``confirm=False``: children found through an index are
        counted from the index alone (a look whose finding could not stand yet).
        """
        settle = self._followups.settle
        agreed: Snapshot | None = None
        for attempt in range(settle.attempts):
            if attempt:
                settle.pause(attempt)
            before = first if first and not attempt else self._table.read_parent(rule, key)
            if rule.through is None:
                tally = self._table.tally_children(rule, key)
            else:
                # Read after the parent: every change the stream showed up to that read.
                recent = self._recent.recent_children(rule.name, key, rule.through.window)
                tally = self._table.tally_indexed(
                    rule, key, before.counter, confirm=confirm, recent=recent
                )
            after = self._table.read_parent(rule, key)
            if not before.same_as(after):
                agreed = None
                continue
            snapshot = Snapshot(after, tally)
            # Children found through an index are confirmed a grace apart (verify_indexed).
            if rule.revision is not None or rule.through is not None:
                return snapshot
            if not drifted(rule, after, tally):
                return snapshot
            if agreed is not None and agreed == snapshot:
                return Snapshot(after, tally, confirmations=2)
            agreed = snapshot
        return None

    def finding_of(
        self,
        rule: TallyRule,
        key: Key,
        snapshot: Snapshot,
        group: Group | None,
        first_seen: str | None = None,
    ) -> Finding | None:
        """The judgement of a settled recount as a finding; None: consistent."""
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
        details = verdict.details
        if rule.split is not None and snapshot.parent.exists:
            details = (*details, shards.described(snapshot.parent.base, snapshot.parent.shards))
        return Finding(
            kind=verdict.kind,
            rule=rule.name,
            table=self._table.name,
            key=key,
            attribute=verdict.attribute,
            stored=stored,
            actual=verdict.actual,
            evidence=tuple(group.evidence) if group else (),
            detail="; ".join(details),
            revision=snapshot.parent.revision,
            first_seen=group.first_seen if group else first_seen,
        )

    def report_malformed(self, rule: TallyRule, key: Key, tally: ChildTotal) -> None:
        """A child whose amount is not a number counts 0: each is a finding of its own, by its
        key, attribute and type (never its value), never repaired."""
        if isinstance(rule, SumRule):
            for child, kind in tally.unreadable:
                self._followups.alert(malformed_amount(rule, self._table.name, key, child, kind))

    def apply_ttl_expiries(self, rule: TallyRule, group: Group, done: Done) -> None:
        """Rules that treat TTL expiry as a decrement: apply each exactly once."""
        if not group.expiries:
            return
        refused = []
        if not self._repairer.may_decrement() or group.parent_removed:
            # No writes allowed, or the parent was removed (and perhaps made again) in this
            # batch: its new life owes these children nothing. They count as removals.
            refused = group.expiries
        else:
            for expiry in group.expiries:
                outcome = self._repairer.decrement(rule, group.parent_key, expiry)
                if outcome == "applied":
                    done.append(Outcome.DECREMENTED)
                elif outcome == "refused":
                    refused.append(expiry)
        # Removals the table did not take as decrements surface through the recount.
        group.child_delta = subtract(group.child_delta, exact_sum(e.delta for e in refused))
        group.ttl_removed = group.ttl_removed or bool(refused)
        group.expiries = []


def reference_state(rule: TallyRule, parent: ParentState) -> str:
    """The parent's state a look is sent with, to judge only a parent that held still (its
    stamps too, for a rule whose writers stamp: ``Looks`` judges it at a revision)."""
    state = lifecycle.state_of(parent.exists, parent.counter, parent.revision)
    if rule.through is None or rule.through.stamp is None:
        return state
    newest = parent.stamps[0] if parent.stamps else ""
    return stamps.stamped_state(state, newest, parent.stamped_total)
