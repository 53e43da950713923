"""Looks at a parent a lag or a grace after its change (docs/verification.md): a counter a
stream aggregator keeps ("Asynchronous counters"), children found through an index ("Children
found through an index"), and a parent its writers stamp, judged at a revision while it
moves ("Parents that never rest"). Each recounts and judges through ``counts``; a finding
stands only when two looks agree."""

from __future__ import annotations

from dataclasses import replace

from tally.reconciler.checks.counts import Counts, Snapshot, reference_state
from tally.reconciler.checks.followups import Followups, observation
from tally.reconciler.checks.links import ReplicationLinks
from tally.reconciler.checks.regions import ESCALATED, Contention
from tally.reconciler.findings import Finding
from tally.reconciler.protocol import lifecycle, stamps
from tally.reconciler.protocol.judgement import ParentState
from tally.reconciler.protocol.lifecycle import Observed
from tally.reconciler.report.rechecks import MAX_DELAY_SECONDS, Recheck
from tally.reconciler.report.scheduling import INDEX_CONFIRM, INDEX_MOVED
from tally.reconciler.stats import Done, Outcome
from tally.reconciler.store.recent import RecentChildren
from tally.reconciler.table.parent_reads import ParentReads
from tally.rules import Key, TallyRule

# Looks a grace apart at a stamped parent whose changes are not all known yet (a child half
# on its way): after these, each waits twice as long, as at a parent that keeps moving.
STAMPED_LOOKS = 8


class Looks:
    """Rechecks of count and sum parents: judged a lag or a grace after their change, or at
    once (``counts``)."""

    def __init__(
        self,
        counts: Counts,
        table: ParentReads,
        followups: Followups,
        recent: RecentChildren,
        contention: Contention | None = None,
        links: ReplicationLinks | None = None,
    ):
        self._counts = counts
        self._table = table
        self._followups = followups
        self._recent = recent
        self._contention = contention  # a Global Table's home Region only
        self._links = links  # likewise

    def verify(self, rule: TallyRule, key: Key, sent: Recheck | None, done: Done) -> None:
        """Recount one parent outside a batch (a recheck ``sent`` to it, or the full audit): a
        counter an aggregator keeps is judged a lag apart, children found through an index a
        grace apart, any other at once."""
        observed = sent.observed if sent else None
        if rule.lag_seconds is not None:
            self.verify_aggregated(rule, key, observed, done)
        elif rule.through is not None:
            self.verify_indexed(rule, key, sent, done)
        else:
            self._counts.verify_parent(rule, key, None, done, observed=observed)

    def verify_aggregated(
        self, rule: TallyRule, key: Key, observed: Observed | None, done: Done
    ) -> None:
        """Judge a counter a stream aggregator keeps: a finding only if it held across the lag.

        Whatever deltas were pending at one recount have landed a lag later, so an offset
        (stored - actual) seen again a lag later, on an unchanged parent, is no lag. An offset
        that moved was moved by stream records, whose batches recheck it again. Never
        repaired: a write would race the aggregator's pending deltas.
        """
        snapshot = self._observed_recount(rule, key, observed)
        if snapshot is None:
            done.append(Outcome.DEFERRED)
            reason = "parent kept changing during recount"
            self._followups.schedule(rule, key, 0, reason, observed)
            return
        finding = self._counts.finding_of(rule, key, snapshot, None)
        done.append(Outcome.CONSISTENT if finding is None else Outcome.CHECKED)
        if finding is None:
            self._followups.consistent(rule, key)  # a drift that returns is news
            return
        seen = observation(finding)
        if finding.kind != "invalid_counter" and not lifecycle.same(observed, seen):
            self._followups.unconfirmed(finding)
            if observed is None or lifecycle.offset(observed) == lifecycle.offset(seen):
                # First sight, or the offset held while the parent moved: look a lag later.
                reason = "aggregated counter off after its lag"
                self._followups.schedule(rule, key, 0, reason, seen)
            # Otherwise the offset moved, and the records that moved it bring their rechecks.
            return
        if self._contention is None:
            held = (
                f"the same counter and truth {rule.lag_seconds} s apart: not the aggregator's lag"
            )
            why = (
                "a counter kept by a stream aggregator is never repaired: it would race the deltas"
            )
        else:  # a Global Table's home Region: a rule judged once replication settled
            held = f"the same counter and truth {rule.lag_seconds} s apart: replication settled"
            why = f"the rule's repair is {rule.repair!r}: alerted, not repaired"
        settled = replace(finding, detail="; ".join(p for p in (finding.detail, held) if p))
        # Replication from a Region is behind: the writes it holds may be this imbalance's
        # other half. Judged again a window later, from what this saw.
        if self._held(rule, key, finding, seen):
            return
        if rule.repair != "auto":
            self._followups.skip(settled, why)
            return
        # Only a Global Table's settled rule (protocol.regions.settled_rules; an aggregator's
        # rule is never "auto"): repaired fenced on what this recount read, unless the parent
        # keeps losing its increments (checks.regions.Contention).
        escalated = self._contention and self._contention.escalated(rule, key, settled)
        if escalated:
            self._followups.skip(escalated, ESCALATED)
        elif not self._counts.repair(rule, key, snapshot, settled):
            # The parent moved after this recount: judged from there, a window later.
            self._followups.schedule(rule, key, 0, "moved under a settled repair", seen)

    def verify_indexed(self, rule: TallyRule, key: Key, sent: Recheck | None, done: Done) -> None:
        """Judge a parent whose children are found through an index, a grace after its change
        (docs/verification.md, "Children found through an index"): only a parent still in the
        state it was ``sent`` with (its reference) and unmoved through the look; otherwise it
        looks again, later each time. A finding stands when the next look sees the same
        counter and truth (the observation it was sent with); the repair is fenced on the
        counter and revision that look read, and on the parent existing."""
        observed = sent.observed if sent else None
        looks = sent.looks if sent else 0
        parent = self._table.read_parent(rule, key)
        state = reference_state(rule, parent)
        since = stamps.reference(sent.reference if sent else None)
        if since is not None and parent.exists and stamps.revision_of(parent.revision) is not None:
            self._verify_stamped(rule, key, since, parent, done, sent)
            return
        if state != (sent.reference if sent else None):
            # Nothing to judge yet. What was seen of a parent that is gone still holds.
            done.append(Outcome.LEFT)
            self._look_again(rule, key, state, observed if not parent.exists else None, looks)
            return
        snapshot = self._observed_recount(rule, key, observed, parent)
        if snapshot is not None and not snapshot.parent.same_as(parent):
            # It moved during this look: judged from there, later.
            done.append(Outcome.LEFT)
            self._look_again(rule, key, reference_state(rule, snapshot.parent), None, looks)
            return
        finding = self._counts.judged(rule, key, snapshot, None, None, done)
        if snapshot is None or finding is None:
            return
        assert rule.through is not None
        grace = rule.through.grace_seconds
        if self._held(rule, key, finding, observed, grace, state):
            return
        if finding.kind == "orphans":  # a second look of its own, an orphan grace later
            self._followups.judge_orphans(rule, key, finding, observed)
            return
        seen = observation(finding)
        if not lifecycle.held(observed, seen):
            self._followups.unconfirmed(finding)
            self._followups.schedule(
                rule, key, 0, INDEX_CONFIRM, seen, delay=grace, reference=state
            )
            return
        held = f"the same counter and truth through index {rule.through.index!r} {grace} s apart"
        finding = replace(finding, detail="; ".join(p for p in (finding.detail, held) if p))
        if not self._counts.repair(rule, key, snapshot, finding):
            # The parent moved after this recount: look again, from what is there then.
            self._followups.schedule(rule, key, 0, INDEX_MOVED, delay=grace)

    def _verify_stamped(
        self,
        rule: TallyRule,
        key: Key,
        since: stamps.Reference,
        parent: ParentState,
        done: Done,
        sent: Recheck | None,
    ) -> None:
        """Judge a parent whose writers stamp their changes at a revision it holds, moving or
        not (docs/verification.md, "Parents that never rest"), when every change since the
        reference ``since`` is proven known (``_at_revision``): the truth at that revision is
        the index with the window's notes and the newest change's child as the table holds
        it. A finding stands when the next such look, a grace later, finds the counter off
        from the truth by as much (the parent may have moved between); the repair is fenced
        on the counter and revision that look read. Otherwise (a change still on its way) it
        looks again a grace later, from the parent as it is then, without waiting in the
        look (after ``STAMPED_LOOKS`` such looks on end, twice as late each time): a parent
        is judged only on what is proven, resting or not."""
        assert rule.through is not None
        grace = rule.through.grace_seconds
        observed = sent.observed if sent else None
        looks = sent.looks if sent else 0
        snapshot = None
        settle = self._followups.settle
        for attempt in range(settle.attempts):
            if attempt:  # it moved during the reads, by the writers' changes or not: again
                settle.pause(attempt)
            revision = stamps.revision_of(parent.revision)
            # Gone, a change without a stamp, or more than the stamps keep: nothing proven.
            if (
                not parent.exists
                or revision is None
                or stamps.taken_since(since, revision, parent.stamps) is None
            ):
                break
            snapshot, after = self._at_revision(rule, key, parent, since, confirm=False)
            if (
                snapshot is not None
                and self._counts.finding_of(rule, key, snapshot, None) is not None
            ):
                # Off by the index and the notes: every hit and noted child read from the table.
                snapshot, after = self._at_revision(rule, key, parent, since, confirm=True)
            if snapshot is not None or after is None:
                break  # judged, or not proven (a change still on its way): no use at once
            parent = after
        if snapshot is None:
            done.append(Outcome.LEFT)
            state = reference_state(rule, parent)
            delay = min(grace << max(0, looks + 1 - STAMPED_LOOKS), MAX_DELAY_SECONDS)
            # What an earlier look saw still stands, for the next look that proves.
            self._followups.schedule(
                rule, key, 0, INDEX_MOVED, observed, delay=delay, reference=state, looks=looks + 1
            )
            return
        finding = self._counts.judged(rule, key, snapshot, None, None, done)
        if finding is None:
            return
        if self._held(rule, key, finding, observed, grace, reference_state(rule, snapshot.parent)):
            return
        if finding.kind == "orphans":  # a second look of its own, an orphan grace later
            self._followups.judge_orphans(rule, key, finding, None)
            return
        seen = observation(finding)
        state = reference_state(rule, snapshot.parent)
        if not lifecycle.held_offset(observed, seen):
            self._followups.unconfirmed(finding)
            self._followups.schedule(
                rule, key, 0, INDEX_CONFIRM, seen, delay=grace, reference=state
            )
            return
        proof = (
            f"off by as much at two looks {grace} s apart, every change since revision "
            f"{since.revision} stamped and known"
        )
        finding = replace(finding, detail="; ".join(p for p in (finding.detail, proof) if p))
        if not self._counts.repair(rule, key, snapshot, finding):
            # The parent moved after this recount: judged again from where it is then.
            state = reference_state(rule, self._table.read_parent(rule, key))
            self._followups.schedule(rule, key, 0, INDEX_MOVED, seen, delay=grace, reference=state)

    def _at_revision(
        self,
        rule: TallyRule,
        key: Key,
        parent: ParentState,
        since: stamps.Reference,
        *,
        confirm: bool,
    ) -> tuple[Snapshot | None, ParentState | None]:
        """The truth at the revision ``parent`` holds, if every change since ``since`` is
        known: nothing moved the counter behind the writers' backs, each stamp's child is in
        the window's notes (read while the parent held), but the newest change's, read from
        the table. (None, None) when not every change is known; (None, the parent as it
        was read after) when it moved during the reads."""
        assert rule.through is not None
        recent = self._recent.recent_children(rule.name, key, rule.through.window)
        revision = stamps.revision_of(parent.revision)
        assert revision is not None
        taken = stamps.taken_since(since, revision, parent.stamps)
        newest = self._table.newest_child(rule, parent) if taken else None
        known = stamps.Known.of(recent)
        # A stamp younger than half the window has its note still: it must be there.
        young = self._recent.clock() - rule.through.window / 2
        offset = stamps.offset_of(parent.counter, parent.stamped_total)
        if not stamps.proven(
            since,
            revision,
            offset,
            parent.stamps,
            known,
            newest_read=newest is not None,
            young_since=young,
        ):
            return None, None
        tally = self._table.tally_indexed(
            rule, key, parent.counter, confirm=confirm, recent=recent, read=newest
        )
        after = self._table.read_parent(rule, key)
        return (Snapshot(after, tally), None) if parent.same_as(after) else (None, after)

    def _observed_recount(
        self, rule: TallyRule, key: Key, observed: Observed | None, first: ParentState | None = None
    ) -> Snapshot | None:
        """A settled recount; through an index, from the index alone, then, only if its finding
        would stand (the same as ``observed``), again with each hit confirmed in the table."""
        snapshot = self._counts.settled_recount(rule, key, first, confirm=False)
        if snapshot is None or rule.through is None:
            return snapshot
        finding = self._counts.finding_of(rule, key, snapshot, None)
        if finding is None or not lifecycle.held(observed, observation(finding)):
            return snapshot
        return self._counts.settled_recount(rule, key)

    def _held(
        self,
        rule: TallyRule,
        key: Key,
        finding: Finding,
        observed: Observed | None,
        delay: int | None = None,
        reference: str | None = None,
    ) -> bool:
        """On a Global Table's home Region, whether a finding waits for a replication link that
        is behind (``checks.links``): looked at again ``delay`` later (default: the rule's
        lag), from ``reference``, with ``observed``."""
        waiting = self._links.held() if self._links is not None else None
        if not waiting:
            return False
        self._followups.unconfirmed(finding)
        reason = f"held: {waiting}"
        self._followups.schedule(rule, key, 0, reason, observed, delay=delay, reference=reference)
        return True

    def _look_again(
        self, rule: TallyRule, key: Key, state: str, observed: Observed | None, looks: int
    ) -> None:
        """Looked at again from ``state``, twice as late each time the parent keeps moving."""
        assert rule.through is not None
        delay = min(rule.through.grace_seconds << min(looks, 10), MAX_DELAY_SECONDS)
        self._followups.schedule(
            rule, key, 0, INDEX_MOVED, observed, delay=delay, reference=state, looks=looks + 1
        )
