"""Step 3, repair: policy -> marker -> one fenced transaction -> outbox.

Every repair (a counter set to its recount, a sequence counter raised to its highest member,
a VOID tombstone) takes the same path: the policy may refuse the write (the finding is
alerted as it stands); otherwise a fresh marker names the write, and the write commits in one
transaction with its log, its marker's record, the finding and its alert, which is published
once the transaction committed. A TTL expiry's decrement is fenced by a marker of its own.

On a strongly consistent Global Table (MRSC: no transaction may touch the counted table) a
counter is repaired apart, in three steps: the marker's record, holding the audit items the
repair owes; the fenced write alone; then those items in one transaction on the audit table,
once, by the repair or by its write's own stream record (docs/verification.md, "Global
Tables"). A VOID tombstone or a decrement needs a transaction: there, neither is written.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

from tally.reconciler.findings import AlertMessage, Finding, Repair
from tally.reconciler.protocol import shards
from tally.reconciler.protocol.judgement import ParentState
from tally.reconciler.repair.policy import RepairPolicy
from tally.reconciler.report.reporter import Reporter
from tally.reconciler.store.log import FindingLog
from tally.reconciler.store.outbox import AlertOutbox
from tally.reconciler.store.standing import StandingFindings
from tally.reconciler.stream.changes import Expiry
from tally.reconciler.table.fenced_writes import DecrementOutcome, FencedWrites, VoidOutcome
from tally.rules import AnyRule, Key, SequenceRule, TallyRule

Written = TypeVar("Written")
# The fenced write: given the marker and the audit items that commit with it, its outcome.
FencedWrite = Callable[[str, Sequence[Mapping[str, Any]] | None], Written]
# Why a VOID tombstone is not written where transactions are refused.
NO_TRANSACTION = "a VOID tombstone needs a transaction, which this (MRSC) table refuses"
# Why a counter split per Region is not repaired: by the home Region only, in its own shard.
NO_HOME_SHARD = (
    "a counter split per Region is repaired in the home Region's own shard, by the home "
    "Region's reconciler: this one runs on no Global Table (GLOBAL_REGIONS)"
)
NO_SPLIT_TRANSACTION = (
    "a split counter's repair fences every shard in one transaction, which this (MRSC) "
    "table refuses"
)


class Repairer:
    """Writes what the policy allows on the counted table, fenced, with its audit items."""

    def __init__(
        self,
        table: FencedWrites,
        log: FindingLog,
        standing: StandingFindings,
        outbox: AlertOutbox,
        policy: RepairPolicy,
        reporter: Reporter,
        *,
        apart: bool = False,
        home: str | None = None,
        regions: tuple[str, ...] = (),
    ):
        self._table = table
        self._log, self._standing, self._outbox = log, standing, outbox
        self.policy = policy
        self._reporter = reporter
        # MRSC: the counted table refuses transactions, so its write goes apart from the log.
        self.apart = apart
        # A Global Table's home Region (and its Regions): where a split counter is repaired,
        # in the home Region's own shard. None: no split counter is repaired here.
        self.home, self.regions = home, regions

    def writes(self, rule: AnyRule) -> bool:
        """Whether a repair of this rule could be written now (budget aside)."""
        return self.policy.writes(rule)

    def set_counter(
        self,
        rule: AnyRule,
        finding: Finding,
        why: str,
        state: ParentState,
        value: Decimal,
    ) -> bool | None:
        """Set the finding's counter to ``value``, fenced on the ``state`` it was judged on.
        None: not allowed (the finding is alerted as it stands); False: the fence failed,
        nothing was written; True: repaired and announced."""
        if isinstance(rule, TallyRule) and rule.split is not None:
            return self._set_split(rule, finding, why, state, value)
        key = finding.key
        return self._write(
            rule,
            finding,
            Repair("applied", why, finding.stored, value),
            lambda: key,
            {rule.counter: value},
            lambda marker, logged: self._table.set_counter(rule, key, state, value, marker, logged),
            committed=True,
        )

    def _set_split(
        self, rule: TallyRule, finding: Finding, why: str, state: ParentState, value: Decimal
    ) -> bool | None:
        """A split counter's total set to ``value`` through the home Region's own shard, in
        one transaction fenced on the parent and every shard as judged
        (``FencedWrites.set_split``)."""
        key, home, refusal = finding.key, self.home, None
        after = None
        if home is None:
            refusal = NO_HOME_SHARD
        elif self.apart:
            refusal = NO_SPLIT_TRANSACTION
        elif isinstance(state.counter, Decimal):
            after = shards.home_after(dict(state.shards).get(home), state.counter, value)
            refusal = None if after is not None else "the home shard cannot hold the total"
        shard = rule.shard_key(key, home or "", self._table.rules.table)
        return self._write(
            rule,
            finding,
            Repair("applied", f"{why}, through the shard of {home}", finding.stored, value),
            lambda: shard,
            {rule.counter: after},
            lambda marker, logged: self._table.set_counter(
                rule, key, state, value, marker, logged, shard_region=home, regions=self.regions
            ),
            committed=True,
            refusal=refusal,
        )

    def put_void(
        self, rule: SequenceRule, finding: Finding, number: int, anchor: Key, refusal: str | None
    ) -> VoidOutcome | None:
        """A VOID tombstone for the finding's missing ``number``, unless the policy or a
        ``refusal`` says no (None: the finding is alerted as it stands)."""
        key = finding.key
        return self._write(
            rule,
            finding,
            Repair("applied", "VOID tombstone written", None, "VOID"),
            lambda: self._table.void_key(rule, key, number),  # only once the write is allowed
            {"void": True},
            # Never apart (NO_TRANSACTION): it always commits with its audit items.
            lambda marker, logged: self._table.put_void(
                rule, key, number, anchor, marker, logged or ()
            ),
            committed="written",
            refusal=refusal or (NO_TRANSACTION if self.apart else None),
        )

    def may_decrement(self) -> bool:
        """Whether a TTL expiry may be applied as a decrement now (never apart: the decrement
        is made once by its marker's put in the same transaction)."""
        return self.policy.enabled and not self.policy.dry_run and not self.apart

    def decrement(self, rule: TallyRule, key: Key, expiry: Expiry) -> DecrementOutcome:
        """Apply a TTL expiry's decrement once: its marker is the expiry's own."""
        marker = f"ttl:{expiry.event_id}"
        logged = self._log.marker_put(marker, key)
        return self._table.decrement(rule, key, expiry.delta, marker, logged)

    def _write(
        self,
        rule: AnyRule,
        finding: Finding,
        fix: Repair,
        target: Callable[[], Key],
        written: Mapping[str, Any],
        write: FencedWrite[Written],
        *,
        committed: Written,
        refusal: str | None = None,
    ) -> Written | None:
        """Write ``fix`` unless the policy, or a ``refusal`` the policy would otherwise allow,
        says no: then the finding is alerted as it stands, and None. Otherwise the write's
        outcome; the one that ``committed`` announces the repair."""
        verdict = self.policy.verdict(rule, fix.before, fix.after)
        if verdict is None and refusal is not None:
            verdict = Repair("skipped", refusal)
        if verdict is not None:
            self._reporter.alert_unrepaired(finding.with_repair(verdict))
            return None
        repaired = self._reporter.shown(finding.with_repair(fix))
        marker = f"r:{secrets.token_hex(12)}"
        message = AlertMessage.of(repaired, repaired.alert_id(marker))
        audit = [
            self._log.repair_put(repaired, fix),
            self._log.finding_put(repaired),
            self._standing.standing_delete(repaired),
            self._outbox.outbox_put(message),
        ]
        if self.apart:
            # 1. the marker's record first, so the write's stream record is known as ours and
            # can finish the repair; 2. the write alone; 3. the audit items, once.
            self._log.put_marker(self._log.marker_put(marker, target(), written, audit))
            outcome = write(marker, None)
            if outcome == committed and self._log.finish_repair(marker, audit):
                self._reporter.alert_repaired(repaired, message)
            return outcome
        logged = [audit[0], self._log.marker_put(marker, target(), written), *audit[1:]]
        outcome = write(marker, logged)
        if outcome == committed:
            self._reporter.alert_repaired(repaired, message)
        return outcome

    def finish_claimed(self, marker: str) -> bool:
        """A repair written apart whose write a stream record showed (a claim confirmed): its
        audit items committed if the repair did not live to commit them, its alert released
        to the next flush. Whether it was left to finish here."""
        pending = self._log.pending_repair(marker)
        if not pending or not self._log.finish_repair(marker, pending):
            return False
        self._outbox.release_puts(pending)
        return True
