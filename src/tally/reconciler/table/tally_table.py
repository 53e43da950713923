"""The main table as the reconciler sees it: settled reads, recounts and fenced repairs.

Every read is strongly consistent (GSI queries excepted: DynamoDB offers none); every
write is fenced on the state that was verified (``fenced_writes``).
"""

from __future__ import annotations

from tally.reconciler.table.fenced_writes import FencedWrites
from tally.reconciler.table.member_reads import MemberReads


class TallyTable(MemberReads, FencedWrites):
    """Reads and repairs on the main table for the reconciler."""
