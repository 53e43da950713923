"""Repair safety: per-rule modes, the global kill switch, dry run and the per-invocation budget."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from tally.reconciler.findings import Repair
from tally.reconciler.protocol.repair import refusal
from tally.reconciler.repair.switches import Switches
from tally.rules import AnyRule


@dataclass
class RepairPolicy:
    """Decides, before any write, whether a repair may be attempted. ``switches``: what the
    repair switches said when the invocation began (shown in its alerts), if they were read."""

    enabled: bool = True
    dry_run: bool = False
    budget: int = 25
    used: int = field(default=0)
    switches: Switches | None = None
    # Item collections are verified concurrently: the budget is taken under this lock.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def of(cls, switches: Switches) -> RepairPolicy:
        """The policy the switches set (switches that could not be read: no repairs)."""
        return cls(switches.enabled, switches.dry_run, switches.budget, switches=switches)

    def writes(self, rule: AnyRule) -> bool:
        """Whether a repair of this rule could be written now (budget aside)."""
        return rule.repair == "auto" and self.enabled and not self.dry_run

    def verdict(self, rule: AnyRule, before: Any, after: Any) -> Repair | None:
        """None: go ahead and write (one unit of the budget is taken). Otherwise the outcome
        that stands instead of a write."""
        with self._lock:
            refused = refusal(
                rule.name,
                rule.repair,
                enabled=self.enabled,
                dry_run=self.dry_run,
                budget=self.budget,
                used=self.used,
                switched_by=self._switched_by(),
            )
            if refused is None:
                self.used += 1
                return None
        status, why = refused
        if status == "dry_run":  # what would have been written
            return Repair(status, why, before, after)
        return Repair(status, why)

    def _switched_by(self) -> str:
        """Where the switch that refuses came from, when the repair switches set it."""
        switches = self.switches
        if switches is None or switches.source == "environment":
            return ""
        off = not self.enabled and not switches.enabled
        dry = self.enabled and self.dry_run and switches.dry_run
        if not (off or dry):
            return ""  # set by the caller (an operator's dry-run audit), not the switches
        if switches.unreadable:
            return f"{switches.source} cannot be read: {switches.unreadable}"
        return switches.source
