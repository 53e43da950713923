"""Access to the main table shared by its readers and writers: the client, keys, read costs."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import Backoff, Names, deserialize, serialize
from tally.rules import Key, RuleSet

ABSENT = None  # a counter or revision the item does not hold
BATCH_GET = 100  # BatchGetItem's limit of keys per request


@dataclass
class Reads:
    """What verification cost (items read, read capacity consumed), and how far behind the
    indexes it read were."""

    items: int = 0
    capacity: Decimal = Decimal(0)
    recounts: int = 0
    # Per look through an index: at least how many seconds the index was behind the stream.
    index_behind: list[float] = field(default_factory=list)
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

    def looked_through_index(self, behind: float) -> None:
        with self._lock:
            self.index_behind.append(behind)


class TableAccess:
    """The main table's client, name and rules, with the reads it cost so far."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        rules: RuleSet,
        backoff: Backoff | None = None,
        reads: Reads | None = None,
    ):
        self.client = client
        self.name = table_name
        self.rules = rules
        self.reads = reads if reads is not None else Reads()  # shared by a table's parts
        self.backoff = backoff or Backoff()
        self._pk = rules.table.partition_key
        self._sk = rules.table.sort_key

    def _key(self, key: Key) -> dict[str, Any]:
        return serialize(self.rules.table.typed(key))

    def _value(self, key: Key, attribute: str) -> Any:
        return self.rules.table.typed(key)[attribute]

    def _get_items(self, keys: Iterable[Key], *attributes: str | None) -> list[dict[str, Any]]:
        """The items at ``keys`` that exist, by consistent BatchGetItem (100 keys a request),
        with the key attributes and ``attributes``; throttled keys are asked again."""
        names = Names.of(*self.rules.table.names, *attributes)
        found: list[dict[str, Any]] = []
        wanted = [self._key(key) for key in keys]
        for start in range(0, len(wanted), BATCH_GET):
            request = {
                "Keys": wanted[start : start + BATCH_GET],
                "ConsistentRead": True,
                "ProjectionExpression": ", ".join(names.mapping.values()),
                "ExpressionAttributeNames": names.expression_names,
            }
            found += self._batch_get(request)
        return found

    def _batch_get(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        found = []
        for attempt in range(self.backoff.attempts):
            response = self.client.batch_get_item(
                RequestItems={self.name: request}, ReturnConsumedCapacity="TOTAL"
            )
            items = response["Responses"].get(self.name, [])
            consumed = response.get("ConsumedCapacity") or [{}]  # one entry: one table
            self.reads.add({"ConsumedCapacity": consumed[0]}, len(items))
            found += [deserialize(raw) for raw in items]
            unprocessed = response.get("UnprocessedKeys", {}).get(self.name)
            if not unprocessed:
                return found
            request = unprocessed  # throttled keys come back to be asked again
            self.backoff.pause(attempt)
        raise RuntimeError(
            f"{self.name}: keys still unprocessed after {self.backoff.attempts} tries"
        )
