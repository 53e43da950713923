"""Step 3, repair: policy -> marker -> one fenced transaction -> outbox.

Every repair (a counter set to its recount, a sequence counter raised to its highest member,
a VOID tombstone) takes the same path: the policy may refuse the write (the finding is
alerted as it stands); otherwise a fresh marker names the write, and the write commits in one
transaction with its log, its marker's record, the finding and its alert, which is published
once the transaction committed. A TTL expiry's decrement is fenced by a marker of its own.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

from tally.reconciler.findings import AlertMessage, Finding, Repair
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
FencedWrite = Callable[[str, Sequence[Mapping[str, Any]]], Written]


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
    ):
        self._table = table
        self._log, self._standing, self._outbox = log, standing, outbox
        self.policy = policy
        self._reporter = reporter

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
            lambda marker, logged: self._table.put_void(rule, key, number, anchor, marker, logged),
            committed="written",
            refusal=refusal,
        )

    def may_decrement(self) -> bool:
        """Whether a TTL expiry may be applied as a decrement now."""
        return self.policy.enabled and not self.policy.dry_run

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
        logged = [
            self._log.repair_put(repaired, fix),
            self._log.marker_put(marker, target(), written),
            self._log.finding_put(repaired),
            self._standing.standing_delete(repaired),
            self._outbox.outbox_put(message),
        ]
        outcome = write(marker, logged)
        if outcome == committed:
            self._reporter.alert_repaired(repaired, message)
        return outcome
