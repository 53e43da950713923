"""Step 3, repair: policy -> marker -> one fenced transaction -> outbox.

Every repair (a counter set to its recount, a sequence counter raised to its highest member,
a VOID tombstone) takes the same path: the policy may refuse the write (the finding is
alerted as it stands); otherwise a fresh marker names the write, and the write commits in one
transaction with its log, its marker's record, the finding and its alert, which is published
once the transaction committed.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tally.reconciler.audit_store import AuditStore
from tally.reconciler.findings import AlertMessage, Finding, Repair
from tally.reconciler.repairs import RepairPolicy
from tally.reconciler.reporter import Reporter
from tally.rules import AnyRule, Key

Written = TypeVar("Written")
# The fenced write: given the marker and the audit items that commit with it, its outcome.
FencedWrite = Callable[[str, list[dict[str, Any]]], Written]


class Repairer:
    """Writes a repair the policy allows, fenced, with its audit items; alerts the outcome."""

    def __init__(self, store: AuditStore, policy: RepairPolicy, reporter: Reporter):
        self._store = store
        self.policy = policy
        self._reporter = reporter

    def writes(self, rule: AnyRule) -> bool:
        """Whether a repair of this rule could be written now (budget aside)."""
        return self.policy.writes(rule)

    def may_decrement(self) -> bool:
        """Whether a TTL expiry may be applied as a decrement now."""
        return self.policy.enabled and not self.policy.dry_run

    def expiry_marker(self, event_id: str, key: Key) -> tuple[str, dict[str, Any]]:
        """The marker of one TTL expiry's decrement (applied once: the marker is the
        expiry's own), and the record of it that commits with the decrement."""
        marker = f"ttl:{event_id}"
        return marker, self._store.marker_put(marker, key)

    def repair(
        self,
        rule: AnyRule,
        finding: Finding,
        fix: Repair,
        target: Key,
        written: Mapping[str, Any],
        write: FencedWrite[Written],
        *,
        committed: Written,
        refusal: str | None = None,
    ) -> Written | None:
        """Write ``fix`` (an applied repair: its before and after) unless the policy, or a
        ``refusal`` the policy would otherwise allow, says no: then the finding is alerted as
        it stands, and None. Otherwise the write's outcome; the one that ``committed``
        announces the repair."""
        verdict = self.policy.verdict(rule, fix.before, fix.after)
        if verdict is None and refusal is not None:
            verdict = Repair("skipped", refusal)
        if verdict is not None:
            self._reporter.alert_unrepaired(finding.with_repair(verdict))
            return None
        repaired = finding.with_repair(fix)
        marker = f"r:{secrets.token_hex(12)}"
        message = AlertMessage.of(repaired, repaired.alert_id(marker))
        logged = [
            self._store.repair_put(repaired, fix),
            self._store.marker_put(marker, target, dict(written)),
            self._store.finding_put(repaired),
            self._store.standing_delete(repaired),
            self._store.outbox_put(message),
        ]
        outcome = write(marker, logged)
        if outcome == committed:
            self._reporter.alert_repaired(repaired, message)
        return outcome
