"""The audit table's key design and lifetimes (docs/audit-table.md), shared by its parts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from tally.core.numbers import DYNAMODB
from tally.reconciler.findings import Finding

DAY = 86_400
FINDING_TTL = 90 * DAY


class StorePart:
    """The audit table's client, name and clock."""

    def __init__(self, client: Any, table_name: str, clock: Callable[[], float] = time.time):
        self.client = client
        self.table_name = table_name
        self.clock = clock

    def _expiry(self, seconds: int) -> int:
        return int(self.clock()) + seconds


def canonical(value: Any) -> str:
    """A written value as the stream shows it back (DynamoDB drops a number's trailing zeros)."""
    return str(value.normalize(DYNAMODB)) if isinstance(value, Decimal) else json.dumps(value)


def key_json(key: Mapping[str, str]) -> str:
    return json.dumps(dict(key), sort_keys=True, separators=(",", ":"))


def parent_pk(rule: str, key: Mapping[str, str]) -> str:
    """The partition of everything the audit table keeps about one parent."""
    return f"PARENT#{rule}#{key_json(key)}"


def finding_pk(finding: Finding) -> str:
    return parent_pk(finding.rule, finding.key)
