"""What a full audit checked and found, whichever engine picked its candidates."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tally.reconciler.findings import Off


@dataclass
class AuditReport:
    """What the audit checked and found."""

    rules: list[str]
    engine: str = "scan"
    items_scanned: int = 0
    read_capacity: Decimal = Decimal(0)
    export: dict[str, Any] | None = None
    parents: Counter[str] = field(default_factory=Counter)
    candidates: int = 0
    recounted: int = 0
    sequences: int = 0
    # Items keyed as children of a ``through`` rule that its index cannot hold, as the engine
    # saw them (each is read again before it is reported).
    unindexed: int = 0
    findings: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    # Every parent found off: new, standing (alerted before, still off) or unconfirmed.
    state: list[Off] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "rules": self.rules,
            "engine": self.engine,
            "items_scanned": self.items_scanned,
            "read_capacity": float(self.read_capacity),
            "export": self.export,
            "parents_checked": dict(self.parents),
            "candidates": self.candidates,
            "recounted": self.recounted,
            "sequences_checked": self.sequences,
            "unindexed_seen": self.unindexed,
            "findings": dict(self.findings),
            "repairs": dict(self.repairs),
            "seconds": round(self.seconds, 3),
            "state": [
                off.finding.body() | {"status": off.status, "alerted_at": off.alerted_at}
                for off in self.state
            ],
        }
