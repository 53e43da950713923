"""The Regions' heartbeats on a Global Table (docs/global-tables.md, "Heartbeats"): one item
per Region, in the table itself so that replication carries it, written by that Region's
stack alone (so last writer wins never drops a beat), read by the home Region from its own
replica. No rule may claim their keys."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import deserialize, serialize
from tally.core.regions import BEAT_AT, ORIGIN, heartbeat, heartbeat_key
from tally.rules import RuleSet


def beat_time(skew_ms: int = 0) -> Decimal:
    """Now, as a heartbeat stamps it: epoch seconds to the millisecond (plus a local Region's
    emulated clock skew)."""
    return Decimal(time.time_ns() // 1_000_000 + skew_ms) / 1000


class HeartbeatKeyError(ValueError):
    """The heartbeat item cannot be written: a rule claims its key (its beats would be read
    as a parent or child), or the partition key is not a string."""


class Heartbeats:
    """The heartbeat items of a table keyed by ``partition_key`` (and ``sort_key``)."""

    def __init__(self, client: Any, table_name: str, partition_key: str, sort_key: str | None):
        self.client, self.table_name = client, table_name
        self._keys = (partition_key, sort_key)

    @classmethod
    def of(
        cls, client: Any, table_name: str, rules: RuleSet, regions: tuple[str, ...]
    ) -> Heartbeats:
        """The heartbeats of the table the rules describe, for ``regions``; refused if a key
        attribute is not a string or a rule claims one of their keys."""
        problem = cls.problem(rules, regions)
        if problem:
            raise HeartbeatKeyError(problem)
        table = rules.table
        return cls(client, table_name, table.partition_key, table.sort_key)

    @staticmethod
    def problem(rules: RuleSet, regions: tuple[str, ...]) -> str | None:
        """Why the table cannot hold the Regions' heartbeats, or None."""
        table = rules.table
        for name in (table.partition_key, table.sort_key):
            if name is not None and table.type_of(name) != "S":
                return f"key attribute {name!r} is a {table.type_of(name)}: heartbeats need strings"
        for region in regions:
            key = heartbeat_key(table.partition_key, table.sort_key, region)
            claimed = [m.rule.name for m in rules.classify(key)]
            if claimed:
                return (
                    f"rule {claimed[0]!r} claims the heartbeat key {key}: narrow its key patterns"
                )
        return None

    def key(self, region: str) -> dict[str, str]:
        return heartbeat_key(*self._keys, region)

    def beat(self, region: str, now: Decimal) -> dict[str, Any]:
        """Put ``region``'s heartbeat, stamped ``now`` (epoch seconds, that Region's clock)."""
        item = self.key(region) | {BEAT_AT: now, ORIGIN: region}
        self.client.put_item(TableName=self.table_name, Item=serialize(item))
        return item

    def newest(self, regions: tuple[str, ...]) -> dict[str, Decimal]:
        """When each of ``regions`` last beat, as this replica holds it (consistent reads);
        a Region whose heartbeat it does not hold is missing."""
        found: dict[str, Decimal] = {}
        for region in regions:
            response = self.client.get_item(
                TableName=self.table_name, Key=serialize(self.key(region)), ConsistentRead=True
            )
            beat = heartbeat(deserialize(response.get("Item") or {}))
            if beat is not None and beat[0] == region:
                found[region] = beat[1]
        return found
