"""Access to the main table shared by its readers and writers: the client, keys, read costs."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import Backoff, serialize
from tally.rules import Key, RuleSet

ABSENT = None  # a counter or revision the item does not hold


@dataclass
class Reads:
    """What verification cost: items read and read capacity consumed."""

    items: int = 0
    capacity: Decimal = Decimal(0)
    recounts: int = 0
    # Item collections are verified concurrently: each total moves under this lock.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, response: Mapping[str, Any], items: int) -> None:
        consumed = response.get("ConsumedCapacity") or {}
        with self._lock:
            self.items += items
            self.capacity += Decimal(str(consumed.get("CapacityUnits", 0)))

    def recounted(self) -> None:
        with self._lock:
            self.recounts += 1


class TableAccess:
    """The main table's client, name and rules, with the reads it cost so far."""

    def __init__(
        self, client: Any, table_name: str, rules: RuleSet, backoff: Backoff | None = None
    ):
        self.client = client
        self.name = table_name
        self.rules = rules
        self.reads = Reads()
        self.backoff = backoff or Backoff()
        self._pk = rules.table.partition_key
        self._sk = rules.table.sort_key

    def _key(self, key: Key) -> dict[str, Any]:
        return serialize(self.rules.table.typed(key))

    def _value(self, key: Key, attribute: str) -> Any:
        return self.rules.table.typed(key)[attribute]
