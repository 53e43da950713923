"""Parents that are gone: what a cascade may still change is judged on a second look."""

from __future__ import annotations

from tally.reconciler.findings import Finding, Repair
from tally.reconciler.protocol import lifecycle
from tally.reconciler.protocol.lifecycle import Observed
from tally.reconciler.reporter import Reporter
from tally.reconciler.scheduling import CASCADE, Scheduler
from tally.rules import CountRule, Key, SequenceRule, SumRule


def observation(finding: Finding) -> Observed:
    """What a look saw, for the next look to compare."""
    return lifecycle.observation(finding.stored, finding.actual)


class SecondLooks:
    """Orphans and emptied parents: unconfirmed now, judged a grace period later."""

    def __init__(self, reporter: Reporter, scheduler: Scheduler):
        self._reporter = reporter
        self._scheduler = scheduler

    def judge_orphans(
        self,
        rule: CountRule | SumRule | SequenceRule,
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
        self._reporter.alert_unrepaired(finding.with_repair(Repair("skipped", why)))

    def look_again(
        self,
        rule: CountRule | SumRule | SequenceRule,
        key: Key,
        finding: Finding,
        reason: str,
        counter_seen: int = 0,
    ) -> None:
        """What a cascade may still change is judged on a second look, ``orphan_grace_seconds``
        later, carrying what this look saw."""
        self._reporter.unconfirmed(finding)
        seen, delay = observation(finding), rule.orphan_grace_seconds
        self._scheduler.schedule(rule, key, counter_seen, reason, seen, delay=delay)
