"""The audit table's parts on one client: each step of the reconciler is given the parts it
uses, never the whole.

The store's modules are the only code that knows the table's key design
(docs/audit-table.md). The table has no stream, so nothing written here ever reaches the
reconciler again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tally.reconciler.store.carries import Carries
from tally.reconciler.store.links import Links
from tally.reconciler.store.log import FindingLog
from tally.reconciler.store.outbox import AlertOutbox
from tally.reconciler.store.recent import RecentChildren
from tally.reconciler.store.standing import StandingFindings
from tally.reconciler.store.watermarks import Watermarks


class Store:
    """The reconciler's state in the audit table, part by part."""

    def __init__(self, client: Any, table_name: str, clock: Callable[[], float] = time.time):
        self.client, self.table_name = client, table_name
        self.log = FindingLog(client, table_name, clock)  # findings, repairs, markers
        self.standing = StandingFindings(client, table_name, clock)
        self.outbox = AlertOutbox(client, table_name, clock)
        self.watermarks = Watermarks(client, table_name, clock)
        self.carries = Carries(client, table_name, clock)
        self.recent = RecentChildren(client, table_name, clock)  # the stream's window
        self.links = Links(client, table_name, clock)  # a Global Table's replication links
