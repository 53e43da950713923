"""A Region's heartbeat on a Global Table (docs/global-tables.md, "Heartbeats"): one item per
Region, in the table itself so that replication carries it, written by that Region's stack
alone (so last writer wins never drops a beat). No rule may claim its key."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tally.core.dynamodb import serialize
from tally.core.regions import BEAT_AT, ORIGIN, heartbeat_key
from tally.rules import RuleSet


class HeartbeatKeyError(ValueError):
    """The heartbeat item cannot be written: a rule claims its key (its beats would be read
    as a parent or child), or the partition key is not a string."""


class Heartbeat:
    """Writes this Region's heartbeat item."""

    def __init__(self, client: Any, table_name: str, rules: RuleSet, region: str):
        self.client, self.table_name, self.region = client, table_name, region
        table = rules.table
        if table.partition_key_type != "S":
            raise HeartbeatKeyError(
                f"partition key {table.partition_key!r} is a {table.partition_key_type}: the "
                "heartbeat item needs a string key"
            )
        self.key = heartbeat_key(table.partition_key, table.sort_key, region)
        claimed = [m.rule.name for m in rules.classify(self.key)]
        if claimed:
            raise HeartbeatKeyError(
                f"rule {claimed[0]!r} claims the heartbeat key {self.key}: narrow its key patterns"
            )

    def beat(self, now: Decimal) -> dict[str, Any]:
        """Put the heartbeat, stamped ``now`` (epoch seconds, this Region's clock)."""
        item = self.key | {BEAT_AT: now, ORIGIN: self.region}
        self.client.put_item(TableName=self.table_name, Item=serialize(item))
        return item
