"""Repair safety: per-rule modes, the global kill switch, dry run and the per-invocation budget."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from tally.reconciler.findings import Repair
from tally.reconciler.protocol.repair import refusal
from tally.rules import AnyRule


@dataclass
class RepairPolicy:
    """Decides, before any write, whether a repair may be attempted."""

    enabled: bool = True
    dry_run: bool = False
    budget: int = 25
    used: int = field(default=0)
    # Item collections are verified concurrently: the budget is taken under this lock.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

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
            )
            if refused is None:
                self.used += 1
                return None
        status, why = refused
        if status == "dry_run":  # what would have been written
            return Repair(status, why, before, after)
        return Repair(status, why)
