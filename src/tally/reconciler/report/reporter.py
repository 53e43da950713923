"""Step 5, alerts: findings recorded in the audit table and published through the outbox,
one message per finding, de-duplicated by the finding's identity and outcome."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tally.reconciler.findings import AlertMessage, Finding, Off, Repair
from tally.reconciler.report.alerts import AlertPublisher
from tally.reconciler.stats import StatsBook
from tally.reconciler.store.log import FindingLog
from tally.reconciler.store.outbox import AlertOutbox
from tally.reconciler.store.standing import StandingFindings
from tally.rules import Key


class Reporter:
    """Alerts findings, keeps what this invocation found (``log``) and every parent it found
    off (``off``, the audit's whole state). ``alerting=False``: an operator's dry run that
    only shows findings: nothing recorded or sent. Every alert shows the repair ``switches``
    the invocation began with (as ``Switches.as_json`` shows them)."""

    def __init__(
        self,
        log: FindingLog,
        standing: StandingFindings,
        outbox: AlertOutbox,
        alerts: AlertPublisher,
        stats: StatsBook,
        *,
        alerting: bool = True,
        remind_seconds: int = 0,
        switches: dict[str, Any] | None = None,
    ):
        self._log, self._standing, self._outbox = log, standing, outbox
        self._switches = switches
        self._alerts = alerts
        self._stats = stats
        self.alerting = alerting
        self._remind_seconds = remind_seconds
        self.log: list[Finding] = []
        self.off: list[Off] = []

    def alert_unrepaired(self, finding: Finding) -> None:
        """Alert a finding whose repair wrote nothing, unless it already stands alerted."""
        repair = finding.repair or Repair("skipped", "no repair attempted")
        finding = self.shown(finding.with_repair(repair))
        if not self.alerting:
            self._count(finding)
            self.off.append(Off(finding, "seen"))  # new or standing: the audit store tells
            return
        message = AlertMessage.of(finding, finding.alert_id(finding.detected_at))
        items = [
            self._standing.standing_put(finding, self._remind_seconds),
            self._log.finding_put(finding),
            self._outbox.outbox_put(message),
        ]
        if self._outbox.enqueue(items):  # not alerted before: a finding of its own
            self._count(finding)
            self.off.append(Off(finding, "new"))
            self._alerts.send(message)
            self._stats().alerts += 1
        else:
            self.off.append(Off(finding, "seen"))

    def shown(self, finding: Finding) -> Finding:
        """``finding`` as its alert shows it: with the repair switches."""
        return finding.with_switches(self._switches)

    def alert_repaired(self, finding: Finding, message: AlertMessage) -> None:
        """Publish the alert an applied repair committed with it."""
        self._count(finding)
        self.off.append(Off(finding, "new"))
        self._alerts.send(message)
        self._stats().alerts += 1

    def unconfirmed(self, finding: Finding) -> None:
        """A finding that waits for a second look: part of the state, not alerted yet."""
        self.off.append(Off(finding, "unconfirmed"))

    def clear_standing(self, rule: str, key: Key) -> None:
        """The parent is consistent again: a drift that returns is news."""
        self._standing.clear_standing(rule, key)

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
            since = self._standing.alerted_at(off.finding)
            if since is not None:
                state.append(Off(off.finding, "standing", since))
            else:
                state.append(Off(off.finding, "new" if off.status == "seen" else off.status))
        return state

    def flush_alerts(self) -> None:
        """Send what an earlier failure left in the outbox; a failure here waits for the next."""
        if not self.alerting:
            return
        try:
            sent, errors = self._alerts.flush()
        except Exception as error:
            sent, errors = 0, [f"outbox flush: {type(error).__name__}: {error}"]
        self._stats().alerts += sent
        self._stats().errors.extend(errors)

    def drift_lived(self, finding: Finding) -> None:
        """How long a repaired drift stood, from the first record that showed it."""
        if finding.first_seen:
            born = datetime.fromisoformat(finding.first_seen.replace("Z", "+00:00"))
            self._stats().drift_lifetimes.append((datetime.now(UTC) - born).total_seconds())

    def _count(self, finding: Finding) -> None:
        status = finding.repair.status if finding.repair else "skipped"
        self._stats().findings[finding.kind] += 1
        self._stats().repairs[status] += 1
        self.log.append(finding)
