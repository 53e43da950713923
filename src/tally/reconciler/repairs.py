"""Repair safety: per-rule modes, the global kill switch, dry run and the per-invocation budget."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from tally.reconciler.findings import Repair
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
        """None: go ahead and write. Otherwise the outcome that stands instead of a write."""
        if rule.repair != "auto":
            return Repair("skipped", f"rule {rule.name!r} repair mode is {rule.repair!r}")
        if not self.enabled:
            return Repair("disabled", "repairs are switched off (REPAIRS_ENABLED=false)")
        if self.dry_run:
            return Repair("dry_run", "dry run (DRY_RUN=true): nothing written", before, after)
        with self._lock:
            if self.used >= self.budget:
                return Repair("skipped", f"repair budget of {self.budget} per invocation used up")
            self.used += 1
        return None
