"""Replication links in the audit table (a Global Table): the newest heartbeat this Region
heard from each other Region, and when it arrived (docs/global-tables.md, "Heartbeats").

The audit table is regional, so each Region keeps what it heard; an item moves forward only,
by condition, so batches delivered out of order never move a link back.
"""

from __future__ import annotations

from decimal import Decimal

from tally.core.dynamodb import conditional, deserialize, serialize
from tally.reconciler.protocol.regions import Link
from tally.reconciler.store.items import DAY, StorePart

# A link not heard from in a week is forgotten: "unheard" again.
LINK_TTL = 7 * DAY


class Links(StorePart):
    """What each replication link into this Region last delivered."""

    def heard(self, source: str, beat_at: Decimal, arrived_at: Decimal) -> bool:
        """Note a heartbeat from ``source``; False when a newer one was noted already."""
        return conditional(
            lambda: self.client.put_item(
                TableName=self.table_name,
                Item=serialize(
                    _link_key(source)
                    | {
                        "beatAt": beat_at,
                        "arrivedAt": arrived_at,
                        "expiresAt": self._expiry(LINK_TTL),
                    }
                ),
                ConditionExpression="attribute_not_exists(beatAt) OR beatAt < :at",
                ExpressionAttributeValues=serialize({":at": beat_at}),
            )
        )

    def links(self, sources: tuple[str, ...]) -> dict[str, Link]:
        """The newest heartbeat heard from each of ``sources`` that was heard at all."""
        found: dict[str, Link] = {}
        for source in sources:
            item = deserialize(
                self.client.get_item(
                    TableName=self.table_name, Key=serialize(_link_key(source)), ConsistentRead=True
                ).get("Item")
                or {}
            )
            if isinstance(item.get("beatAt"), Decimal) and isinstance(
                item.get("arrivedAt"), Decimal
            ):
                found[source] = Link(source, item["beatAt"], item["arrivedAt"])
        return found


def _link_key(source: str) -> dict[str, str]:
    return {"PK": f"LINK#{source}", "SK": "HEARD"}
