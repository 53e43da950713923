"""What every rule declares, whatever its kind: its name, parent, counter, revision and repair."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tally.rules.table_keys import Key, KeyPattern, Strict, TableKeys

RepairMode = Literal["auto", "alert", "off"]

# Set by every reconciler write on the counted table; no writer may set it (docs/verification.md).
REPAIR_MARKER = "tallyRepair"
# A rule's name goes into alerts, metric dimensions and audit-table keys (docs/rules.md).
MAX_NAME_LENGTH = 64
# How long children may outlive their parent before they are orphans (a rule option).
ORPHAN_GRACE_SECONDS = 60


class RuleBase(Strict):
    """The fields of every rule: a count, a sum or a sequence."""

    name: Annotated[
        str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[A-Za-z0-9_.-]+$")
    ]
    parent: dict[str, str]
    counter: Annotated[str, Field(min_length=1)]
    revision: str | None = None
    repair: RepairMode = "alert"
    # Children (or members) whose parent (or counter item) is gone are left for a while by
    # an application's cascade: they are judged only once they persisted this long.
    orphan_grace_seconds: Annotated[int, Field(ge=0, le=900)] = ORPHAN_GRACE_SECONDS

    def parent_pattern(self, keys: TableKeys) -> KeyPattern:
        return keys.patterns(self.parent)

    def exact_parent(self, keys: TableKeys) -> Key:
        """The parent key in canonical text (every attribute exact)."""
        return {name: p.value for name, p in self.parent_pattern(keys).items()}
