"""Step 4, gaps: a sequence's batches schedule its recheck; the recheck reads the members
before the counter and judges it (``protocol.gaps``): missing numbers voided, duplicates
reported, a counter behind its members raised. A counter that goes down is a finding at once.
Members numbered in an attribute are read from the member ledger the stream keeps."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from decimal import Decimal
from typing import Any

from tally.core.numbers import counter_problem
from tally.reconciler.checks.followups import Followups
from tally.reconciler.checks.ledger import MemberLedger
from tally.reconciler.checks.links import ReplicationLinks
from tally.reconciler.findings import Finding, Repair, shown
from tally.reconciler.protocol import gaps
from tally.reconciler.protocol.judgement import Kind, ParentState, valid_revision
from tally.reconciler.protocol.repair import never_repaired
from tally.reconciler.repair.repairer import Repairer
from tally.reconciler.report.rechecks import Recheck
from tally.reconciler.stats import Done, Outcome
from tally.reconciler.store.watermarks import Watermarks
from tally.reconciler.stream.changes import Group
from tally.reconciler.table.member_reads import MemberReads
from tally.reconciler.table.parent_reads import ParentReads
from tally.rules import AttributeMembers, Key, SequenceRule

# Missing runs longer than this are one summarised finding: voiding 10^9 numbers one by
# one is no repair (the counter jump itself is the fault).
MAX_VOIDS_PER_GAP = 100
_UNKEYED = "the number is not a member's key: no tombstone can keep it from a late writer"


class Sequences:
    """Judges sequences: their batches now, their members and counter on the recheck."""

    def __init__(
        self,
        parents: ParentReads,
        members: MemberReads,
        store: Watermarks,
        repairer: Repairer,
        followups: Followups,
        links: ReplicationLinks | None = None,
    ):
        """``links``: a Global Table's home Region, whose gaps wait while replication from
        another Region is behind (``checks.links``)."""
        self._parents, self._members = parents, members
        self._links = links
        self._store = store
        self._repairer = repairer
        self._followups = followups
        self._ledger: MemberLedger | None = None
        self._ledger_lock = threading.Lock()

    def _finding(self, rule: SequenceRule, key: Key, kind: Kind, **fields: Any) -> Finding:
        """A finding on the sequence's counter (``fields``: what else it holds)."""
        return Finding(
            kind=kind,
            rule=rule.name,
            table=self._members.name,
            key=key,
            attribute=rule.counter,
            **fields,
        )

    @property
    def ledger(self) -> MemberLedger:
        """The member ledger (attribute-layout sequences), made on first use."""
        with self._ledger_lock:
            if self._ledger is None:
                self._ledger = MemberLedger(self._store.client, self._store.table_name)
        return self._ledger

    def verify_group(self, rule: SequenceRule, group: Group) -> None:
        """A batch of an unbalanced sequence: decreases now, gaps on the recheck."""
        self.report_decreases(rule, group)
        if group.parent_removed:
            self._store.end_sequence(rule.name, group.parent_key)
        elif group.lowest_given_up is not None:
            # A number no longer held is judged again, wherever the watermark stood.
            self._store.lower_watermark(rule.name, group.parent_key, group.lowest_given_up - 1)
        # Step 4: not a gap yet; the increment and its put may sit in different batches.
        # A number given up was handed out long ago: judged even if the counter stood still.
        # Numbers that went away with their counter item are no gaps: if the key is used
        # again before the recheck, they are the new counter's to hand out.
        horizon = 0 if group.parent_removed else max(group.horizon, group.highest_given_up)
        self._followups.schedule(rule, group.parent_key, horizon, "unbalanced")

    def report_decreases(self, rule: SequenceRule, group: Group) -> None:
        """A sequence never goes backwards: a decrease is a finding now, even if healed later."""
        for evidence in group.decreases:
            self._followups.alert(
                self._finding(
                    rule,
                    group.parent_key,
                    "counter_behind",
                    stored=evidence.new,
                    actual=evidence.old,
                    evidence=(evidence,),
                    detail=f"the counter went down from {evidence.old} to {evidence.new}",
                    occurrence=evidence.sequence_number,
                    first_seen=group.first_seen,
                    repair=Repair("skipped", "the recheck raises the counter over its members"),
                )
            )

    def recheck(self, rule: SequenceRule, recheck: Recheck, done: Done) -> None:
        """The authoritative check of one sequence, after its grace period.

        Members are read before the counter, so a number allocated meanwhile can only make
        the counter look ahead, never behind; gaps are judged only up to the horizon the
        recheck carries (numbers handed out at least a grace period ago).
        """
        key = dict(recheck.key)
        waiting = self._links.held() if self._links is not None else None
        if waiting:
            # A member held on a stalled link would be alerted as a gap: judged later.
            done.append(Outcome.DEFERRED)
            reason = f"held: {waiting}"
            self._followups.schedule(
                rule, key, recheck.counter_seen, reason, delay=rule.grace_seconds
            )
            return
        watermark, epoch = self._store.sequence_state(rule.name, key)
        if recheck.epoch != epoch:
            # The counter item was removed since the horizon was seen: its numbers belong to
            # an earlier life of the key, and the new one's are judged from its own batches.
            recheck = replace(recheck, counter_seen=0, epoch=epoch)
        members = self.member_numbers(rule, key, above=watermark)
        counter = self._parents.read_parent(rule, key)
        consistent = False  # checked from here on; consistent once nothing is found
        try:
            anchor, consistent = self.sequence_anchor(
                rule, key, counter, watermark, members, recheck
            )
            if anchor is None:
                return
            held = Counter(number for number, _ in members)
            found = 0
            if rule.has_counter:
                highest = max(held, default=watermark)
                found += self.raise_counter_to_members(rule, key, counter, highest, recheck)
            found += self.report_duplicates(rule, key, held)
            for low, high in gaps.missing_runs(watermark, recheck.counter_seen, held):
                voided = self.void_missing_run(
                    rule, key, low, high, counter.counter, recheck, held, anchor
                )
                if voided is None:
                    break  # the sequence went away meanwhile: nothing more is judged under it
                found += voided
            consistent = not found
            contiguous = gaps.contiguous(watermark, held)
            if contiguous > watermark:
                self._store.advance_watermark(rule.name, key, contiguous)
        finally:
            done.append(Outcome.CONSISTENT if consistent else Outcome.CHECKED)

    def sequence_anchor(
        self,
        rule: SequenceRule,
        key: Key,
        counter: ParentState,
        watermark: int,
        members: list[tuple[int, Key]],
        recheck: Recheck,
    ) -> tuple[Key | None, bool]:
        """The item whose existence justifies judging (and voiding) numbers: the counter item,
        or without a counter the highest member. None: the sequence is not there to judge;
        True with it: it is gone with its members, consistent (otherwise its members wait
        for a look).

        A counter item that is gone is no horizon: numbers that went away with it are no
        gaps. Members it left behind are judged like orphans, once they persist; a sequence
        gone with all its members starts again from its first number if its key is reused.
        """
        if rule.has_counter and counter.exists:
            return key, False
        # Real members only: a VOID tombstone is the reconciler's own, no sign of life.
        remaining = self.member_numbers(rule, key, watermark, voids=False) if members else []
        if not remaining and watermark:
            remaining = self.member_numbers(rule, key, 0, voids=False)
        if not remaining:
            if watermark:
                self._store.lower_watermark(rule.name, key, 0)
            return None, True
        if not rule.has_counter:
            return max(remaining)[1], False
        count = len(remaining)
        finding = self._finding(
            rule,
            key,
            "counter_behind",
            stored=None,
            actual=Decimal(max(remaining)[0]),
            detail=f"the counter item does not exist; {count} members remain",
        )
        self._followups.judge_orphans(rule, key, finding, recheck.observed, recheck.counter_seen)
        return None, False

    def member_numbers(
        self, rule: SequenceRule, key: Key, above: int, *, voids: bool = True
    ) -> list[tuple[int, Key]]:
        """Members above ``above``: from the table, or from the ledger (attribute layout).
        ``voids=False``: real members only, not the tombstones the reconciler wrote."""
        if isinstance(rule.members, AttributeMembers):
            return self.ledger.members(rule, key, above)
        return self._members.member_numbers(rule, key, above, voids=voids)

    def sequence_horizon(self, rule: SequenceRule, key: Key) -> Any:
        """The sequence's end as of now: its counter, or (no counter) its highest member."""
        if rule.has_counter:
            return self._parents.read_parent(rule, key).counter
        watermark = self._store.watermark(rule.name, key)
        return max((n for n, _ in self.member_numbers(rule, key, watermark)), default=watermark)

    def rebuild_ledger(self, rule: SequenceRule, scanned: list[tuple[int, Key]]) -> int:
        """The member ledger made to agree with a scan, before the sequence is judged;
        returns the highest number it dropped (0: none)."""
        counter = dict(rule.parent)
        _, dropped = self.ledger.rebuild(
            rule, counter, scanned, lambda key: self._members.attribute_number(rule, key)
        )
        if dropped:
            # A number no longer held is judged again, wherever the watermark stood.
            self._store.lower_watermark(rule.name, counter, min(dropped) - 1)
        return max(dropped, default=0)

    def raise_counter_to_members(
        self, rule: SequenceRule, key: Key, counter: ParentState, highest: int, recheck: Recheck
    ) -> int:
        """A counter behind its highest member is raised to it (or reported, as the policy
        says); one that moved meanwhile is rechecked. Returns the findings made (0 or 1)."""
        stored = counter.counter
        standing = gaps.counter_standing(rule, stored, highest)
        if standing == "ok":
            return 0
        valid = standing == "behind"
        finding = self._finding(
            rule,
            key,
            "counter_behind" if valid else "invalid_counter",
            stored=stored if valid else shown(stored),
            actual=Decimal(highest),
            revision=counter.revision,
            detail="the next number handed out would collide with a member"
            if valid
            else counter_problem(stored, whole=True) or "",
        )
        if not valid:
            why = "the counter holds no number: a repair writes only over a number it judged"
            self._followups.skip(finding, why)
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
            self._followups.skip(revision, why)
            return 1
        why = "counter raised to the highest member"
        if self._repairer.set_counter(rule, finding, why, counter, Decimal(highest)) is not False:
            return 1
        # The counter moved (a writer caught up): look again, over the same horizon.
        self._followups.schedule(rule, key, recheck.counter_seen, "counter moved during repair")
        return 0

    def report_duplicates(self, rule: SequenceRule, key: Key, held: Counter[int]) -> int:
        duplicated = gaps.duplicates(held)
        for number, count in duplicated:
            self._followups.alert(
                self._finding(
                    rule,
                    key,
                    "duplicate",
                    stored=Decimal(count),
                    actual=Decimal(1),
                    number=rule.shown_number(number),
                    detail=f"{count} members hold number {rule.shown_number(number)}",
                    repair=Repair("skipped", "which member keeps the number is a human decision"),
                )
            )
        return len(duplicated)

    def void_missing_run(
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
        """Void (or report, as the policy says) the missing run low..high, each number as
        soon as its repair is decided; returns the findings made.

        ``held`` learns the numbers now voided or found, so the watermark can pass them.
        None: the sequence went away (its ``anchor`` is gone): nothing is reported.
        """
        base = self._finding(
            rule,
            key,
            "gap",
            stored=shown(stored),
            actual=None,
            number=rule.shown_number(low),
            detail=f"missing after the grace period ({recheck.reason})",
        )
        if high - low + 1 > MAX_VOIDS_PER_GAP:
            why = f"{high - low + 1} numbers missing: too many to void; look at the counter"
            self._followups.alert(
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
        assert finding.number is not None
        number = rule.ordinal(finding.number)
        refusal = None
        if isinstance(rule.members, AttributeMembers):
            refusal = (
                "the number is not a member's key: no tombstone can keep it from a late writer"
            )
        outcome = self._repairer.put_void(rule, finding, number, anchor, refusal)
        if outcome is None:
            return "reported"
        return "voided" if outcome == "written" else outcome
