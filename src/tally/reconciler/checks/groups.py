"""One group of a stream batch (a parent's or a sequence's records): it proves itself
(step 1), or its remainder is carried (step 1b), or it is recounted (step 2), or, for a
sequence, a counter an aggregator keeps or children found through an index, it is left to
its recheck."""

from __future__ import annotations

from tally.reconciler.checks.carry_book import CarryBook
from tally.reconciler.checks.counts import Counts
from tally.reconciler.checks.sequences import Sequences
from tally.reconciler.stats import Done, Outcome
from tally.reconciler.stream.changes import Group
from tally.rules import SequenceRule, TallyRule


class GroupVerifier:
    """Sends each group down its path; ``carrying=False`` recounts instead of carrying."""

    def __init__(
        self,
        counts: Counts,
        sequences: Sequences,
        carries: CarryBook,
        *,
        carrying: bool = True,
    ):
        self._counts = counts
        self._sequences = sequences
        self._carries = carries
        self.carrying = carrying

    def proves_itself(self, group: Group) -> bool:
        """Step 1: a balanced batch proves that nothing new drifted: zero reads. One that may
        hold the other half of an open remainder (its first records) is folded into it. One
        that changed children found through an index is looked at: its balance may pair a
        rogue change with the other half of a transaction whose look, made before this
        batch, trusted the window (docs/verification.md, "Children found through an
        index")."""
        if group.indexed_children:
            return False
        return group.balanced and not self._carries.may_be_open(group)

    def needs_no_table(self, groups: list[Group]) -> bool:
        """A collection whose every group proves itself (none with an index child to
        record), with no TTL expiry to apply and no ledger change: verified where it stands,
        no worker needed."""
        return all(
            not group.expiries and not group.ledger and self.proves_itself(group)
            for group in groups
        )

    def verify(self, group: Group, done: Done) -> None:
        """Verify one group, appending what it came to (``Outcome.reached_table``: past the
        stream)."""
        rule = group.rule
        if isinstance(rule, TallyRule):
            self._counts.remember_children(rule, group)
            self._counts.apply_ttl_expiries(rule, group, done)
        elif group.ledger:
            # Before any judgement: a later recheck reads the members from the ledger.
            self._sequences.ledger.record(rule, group.parent_key, group.ledger)
        if self.proves_itself(group):
            done.append(Outcome.PROVED)
            return
        if isinstance(rule, SequenceRule):
            done.append(Outcome.LEFT)
            self._sequences.verify_group(rule, group)
            return
        left = self._counts.left_to_recheck(rule, group)
        if left is not None:
            done.append(left)
            return
        first = None
        if group.carriable and self.carrying:
            small, first = self._counts.measure_parent(rule, group)
            carried = None if small else self._carries.carry(rule, group)
            if carried is not None:
                done.append(carried)
                return
        self._counts.verify_parent(rule, group.parent_key, group, done, first=first)
