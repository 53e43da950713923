"""Step 1b, the carry: a hot parent's remainder waits in the audit table for the batch that
cancels it (a transaction split by the batch boundary); one that persists past the window is
recounted. The folding itself is ``protocol.carry``'s; this is its reads, writes and rechecks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal

from tally.reconciler.protocol import carry as carrying
from tally.reconciler.protocol.carry import Carry, window_left
from tally.reconciler.report.scheduling import Scheduler
from tally.reconciler.stats import Done, Outcome
from tally.reconciler.store.carries import Carries
from tally.reconciler.stream.changes import Group
from tally.rules import Key, SequenceRule, TallyRule

CarryId = tuple[str, tuple[tuple[str, str], ...]]
# Open carries this process knows of, kept across warm invocations (a hint: one forgotten
# costs a recount after its window, never a finding). Past this many, the hint starts over.
MAX_OPEN_CARRIES = 10_000
# How long a carry's write may still land after its recheck was scheduled: the write's
# bounded retries (3 attempts of at most 3 + 15 s) with room to spare.
CARRY_WRITE_MS = 60_000
# Recount one parent: (rule, key, first_seen), appending what the recount came to.
Recount = Callable[[TallyRule, Key, str | None, Done], None]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class CarryBook:
    """The carries in the audit table, and a hint of which ones are open."""

    def __init__(
        self,
        store: Carries,
        scheduler: Scheduler,
        open_carries: set[CarryId] | None = None,
    ):
        self._store = store
        self._scheduler = scheduler
        self.open_carries = open_carries if open_carries is not None else set()

    def may_be_open(self, group: Group) -> bool:
        """The group may hold the other half of an open remainder (its first records)."""
        return bool(
            self.open_carries
            and group.carriable
            and (group.rule.name, tuple(sorted(group.parent_key.items()))) in self.open_carries
        )

    def carry(self, rule: TallyRule, group: Group) -> Outcome | None:
        """Fold the group's remainder into the parent's carry: carried, or proved where the
        remainder cancels out; None: recount instead.

        Only records past the carry's ``through`` are added, so redelivery, bisection and
        retries never add one twice. A remainder that cancels out is balanced; one that
        becomes non-zero is recounted by a recheck after the window unless a later batch
        cancels it first. A concurrent writer of the carry (the write is fenced) sends the
        group to the recount.
        """
        key = group.parent_key
        previous = self._store.carry(rule.name, key)
        through = max(int(number) for number in group.sequence_numbers)
        folded = carrying.fold(previous, through, group.deltas, now_ms(), group.first_seen)
        if folded.outcome == "folded before":
            return Outcome.CARRIED  # a remainder has its recheck scheduled
        if folded.carry is None:
            return None  # more digits than the audit table holds: recount instead
        carry = folded.carry
        if folded.outcome == "opened":
            # Scheduled before the write: a carry never stands without its recheck. The window
            # runs from the records' stream time: time spent reaching this batch is not added.
            delay = window_left(group.first_at, time.time(), self._scheduler.carry_seconds)
            self._scheduler.schedule(
                rule,
                key,
                0,
                "carried remainder",
                carry_since=carry.since,
                delay=delay,
                carry_through=carry.through,
            )
        if not self._store.put_carry(rule.name, key, previous, carry):
            return None
        self._note(rule, key, carry)
        return Outcome.CARRIED if carry.remainder else Outcome.PROVED

    def recheck(
        self, rule: TallyRule, key: Key, since: int, through: int, recount: Recount, done: Done
    ) -> bool:
        """The window passed: recount a remainder nothing cancelled, then take off what the
        recount covered (the records up to the ``through`` it read). True if it recounted.

        The recheck is scheduled before its carry is written: one that finds the carry
        still short of the records it names (``through``) overtook a slow write, and comes
        back a window later, for as long as the write could still be under way."""
        seen = self._store.carry(rule.name, key)
        if seen.since != since:
            if through and seen.through < through and now_ms() - since < CARRY_WRITE_MS:
                self._scheduler.schedule(
                    rule,
                    key,
                    0,
                    "carried remainder not written yet",
                    carry_since=since,
                    delay=self._scheduler.carry_seconds,
                    carry_through=through,
                )
            return False  # cancelled meanwhile, or a later remainder with its own recheck
        recount(rule, key, seen.first_seen, done)
        for _ in range(self._scheduler.settle.attempts):
            now = self._store.carry(rule.name, key)
            if now.since != since:
                return True  # cancelled meanwhile: nothing is left to take off
            carry = carrying.take_off(seen, now, now_ms())
            if carry is None:
                # Too many digits to carry: a recount now covers every record folded so far.
                recount(rule, key, seen.first_seen, done)
                carry = Carry(Decimal(0), now.through)
            if self._store.put_carry(rule.name, key, now, carry):
                if carry.remainder:  # records folded since the read: their own window
                    self._scheduler.schedule(
                        rule, key, 0, "carried remainder", carry_since=carry.since
                    )
                return True
        self._scheduler.schedule(rule, key, 0, "the carry kept moving", carry_since=since)
        return True

    def _note(self, rule: TallyRule | SequenceRule, key: Key, carry: Carry) -> None:
        name = (rule.name, tuple(sorted(key.items())))
        if not carry.remainder:
            self.open_carries.discard(name)
            return
        if len(self.open_carries) >= MAX_OPEN_CARRIES:
            self.open_carries.clear()
        self.open_carries.add(name)
