"""What a judgement leads to besides a repair: a finding alerted as it stands, a parent
found consistent again, a recheck later, a second look at a parent that is gone (what a
cascade may still change is judged a grace period later)."""

from __future__ import annotations

from tally.reconciler.findings import Finding, Repair
from tally.reconciler.protocol import lifecycle
from tally.reconciler.protocol.lifecycle import Observed
from tally.reconciler.report.reporter import Reporter
from tally.reconciler.report.scheduling import CASCADE, Scheduler, Settle
from tally.rules import AnyRule, Key


def observation(finding: Finding) -> Observed:
    """What a look saw, for the next look to compare."""
    return lifecycle.observation(finding.stored, finding.actual)


class Followups:
    """Hands a judgement to the reporter (alerts, the standing state) and the scheduler
    (rechecks); orphans and emptied parents are unconfirmed now, judged a grace later."""

    def __init__(self, reporter: Reporter, scheduler: Scheduler):
        self._reporter = reporter
        self._scheduler = scheduler
        self.schedule = scheduler.schedule  # a recheck later, and why
        self.send = scheduler.send  # a recheck as it is, later
        # A counter an aggregator keeps, changed: a look a lag later, or one on its way.
        self.look_at_aggregated = scheduler.look_at_aggregated

    @property
    def settle(self) -> Settle:
        """How hard a recount tries before it defers to a recheck."""
        return self._scheduler.settle

    def alert(self, finding: Finding) -> None:
        """A finding alerted as it stands, unless it already stands alerted."""
        self._reporter.alert_unrepaired(finding)

    def skip(self, finding: Finding, why: str) -> None:
        """A finding never repaired, and why: alerted as it stands."""
        self._reporter.alert_unrepaired(finding.with_repair(Repair("skipped", why)))

    def repaired(self, finding: Finding) -> None:
        """A drift repaired: how long it stood, for the metrics."""
        self._reporter.drift_lived(finding)

    def unconfirmed(self, finding: Finding) -> None:
        """A finding that waits for a look: part of the state, not alerted yet."""
        self._reporter.unconfirmed(finding)

    def consistent(self, rule: AnyRule, key: Key) -> None:
        """The parent is consistent again: a drift that returns is news."""
        self._reporter.clear_standing(rule.name, key)

    def judge_orphans(
        self,
        rule: AnyRule,
        key: Key,
        finding: Finding,
        observed: Observed | None,
        counter_seen: int = 0,
    ) -> None:
        """Children (or members) without their parent: a cascade deleting them is normal, so
        they are a finding only once the same ones were seen a grace period apart. Alert-only:
        no parent (or counter item) is ever created for them."""
        if rule.orphan_grace_seconds and not lifecycle.same(observed, observation(finding)):
            self.look_again(rule, key, finding, CASCADE, counter_seen)
            return
        why = "the reconciler never creates a parent or counter item, nor deletes children"
        self.skip(finding, why)

    def look_again(
        self,
        rule: AnyRule,
        key: Key,
        finding: Finding,
        reason: str,
        counter_seen: int = 0,
    ) -> None:
        """What a cascade may still change is judged on a second look, ``orphan_grace_seconds``
        later, carrying what this look saw."""
        self.unconfirmed(finding)
        seen, delay = observation(finding), rule.orphan_grace_seconds
        self.schedule(rule, key, counter_seen, reason, seen, delay=delay)
