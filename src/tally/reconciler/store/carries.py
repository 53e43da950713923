"""The carry book's items in the audit table: one carry per parent, replaced by condition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import conditional, deserialize, serialize
from tally.reconciler.protocol.carry import Carry
from tally.reconciler.store.items import DAY, StorePart, parent_pk

# A carry outlives the stream's 24 h retention, so no redelivery can add a record twice.
CARRY_TTL = 2 * DAY


class Carries(StorePart):
    """Reads and conditional replacements of the parents' carries."""

    def __init__(self, client: Any, table_name: str, clock: Callable[[], float] = time.time):
        super().__init__(client, table_name, clock)
        # Request units the carries consumed (reads and writes), for metrics and benchmarks.
        self.carry_units = Decimal(0)
        self._carry_lock = threading.Lock()

    def carry(self, rule: str, key: Mapping[str, str]) -> Carry:
        """The parent's carry, read consistently; an empty one when there is none."""
        response = self.client.get_item(
            TableName=self.table_name,
            Key=serialize(_carry_key(rule, key)),
            ConsistentRead=True,
            ReturnConsumedCapacity="TOTAL",
        )
        self._consumed(response)
        item = deserialize(response.get("Item") or {})
        if not item:
            return Carry()
        first_seen = item.get("firstSeen")
        return Carry(
            item["remainder"],
            int(item["through"]),
            int(item.get("since", 0)),
            str(first_seen) if first_seen else None,
        )

    def put_carry(self, rule: str, key: Mapping[str, str], previous: Carry, new: Carry) -> bool:
        """Replace ``previous`` by ``new``; False when another writer moved the carry meanwhile."""
        item: dict[str, Any] = {
            **_carry_key(rule, key),
            "remainder": new.remainder,
            "through": str(new.through),
            "since": new.since,
            "expiresAt": self._expiry(CARRY_TTL),
        }
        if new.first_seen:
            item["firstSeen"] = new.first_seen
        if previous.through < 0:
            condition, values = "attribute_not_exists(PK)", None
        else:
            # The whole state, not only ``through``: a recheck that took the remainder off
            # keeps ``through``, and a fold read before it must not put the remainder back.
            condition = "through = :through AND since = :since AND #remainder = :remainder"
            values = {
                ":through": str(previous.through),
                ":since": previous.since,
                ":remainder": previous.remainder,
            }
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "Item": serialize(item),
            "ConditionExpression": condition,
            "ReturnConsumedCapacity": "TOTAL",
        }
        if values:
            request["ExpressionAttributeValues"] = serialize(values)
            request["ExpressionAttributeNames"] = {"#remainder": "remainder"}  # reserved word
        return conditional(lambda: self._consumed(self.client.put_item(**request)))

    def _consumed(self, response: Mapping[str, Any]) -> None:
        consumed = response.get("ConsumedCapacity") or {}
        with self._carry_lock:  # item collections are verified concurrently
            self.carry_units += Decimal(str(consumed.get("CapacityUnits", 0)))


def _carry_key(rule: str, key: Mapping[str, str]) -> dict[str, str]:
    return {"PK": parent_pk(rule, key), "SK": "CARRY"}
