"""The main table as the reconciler sees it: settled reads, recounts and fenced repairs.

Every read is strongly consistent (GSI queries excepted: DynamoDB offers none); every
write is fenced on the state that was verified (``fenced_writes``).
"""

from __future__ import annotations

from typing import Any

from tally.core.dynamodb import Backoff
from tally.reconciler.table.access import TableAccess
from tally.reconciler.table.fenced_writes import FencedWrites
from tally.reconciler.table.heartbeats import Heartbeats
from tally.reconciler.table.member_reads import MemberReads
from tally.reconciler.table.parent_reads import ParentReads
from tally.rules import RuleSet


class TallyTable(TableAccess):
    """The main table's parts on one client, counting the reads of all three: ``parents``
    (a parent and its children's count or sum), ``members`` (a sequence's members) and
    ``writes`` (the fenced repairs); and, on a Global Table, ``heartbeats``. Each step is
    given only the parts it uses."""

    def __init__(
        self, client: Any, table_name: str, rules: RuleSet, backoff: Backoff | None = None
    ):
        super().__init__(client, table_name, rules, backoff)
        self.parents = ParentReads(client, table_name, rules, self.backoff, self.reads)
        self.members = MemberReads(self.parents)  # on the same client, counting the same reads
        self.writes = FencedWrites(client, table_name, rules, self.backoff, self.reads)
        # A Global Table's heartbeat items (read before a settled finding acts); None on a
        # table whose keys cannot hold them (or a rule claims): its Regions never beat.
        table = rules.table
        self.heartbeats = (
            None
            if Heartbeats.problem(rules, ())
            else Heartbeats(client, table_name, table.partition_key, table.sort_key)
        )
