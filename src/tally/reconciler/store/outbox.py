"""The alert outbox in the audit table: pending alerts, leased to one publisher at a time."""

from __future__ import annotations

import json
from typing import Any

from tally.core.dynamodb import Backoff, Cancelled, conditional, deserialize, serialize, transact
from tally.reconciler.findings import AlertMessage
from tally.reconciler.store.items import DAY, StorePart

# A pending alert outlives any retry path (stream retries, rechecks, the daily audit).
OUTBOX_TTL = 14 * DAY
OUTBOX_PK = "OUTBOX"
# How long a publisher holds a pending alert before another may take it over.
LEASE_SECONDS = 60


class AlertOutbox(StorePart):
    """Pending alerts: added with their finding, leased, published, then deleted."""

    def outbox_put(self, message: AlertMessage) -> dict[str, Any]:
        """A pending alert as a ``TransactWriteItems`` Put, leased to the writer that adds it."""
        now = int(self.clock())
        item = {
            "PK": OUTBOX_PK,
            "SK": message.alert_id,
            "subject": message.subject,
            "message": message.body,
            "attributes": json.dumps(message.attributes, sort_keys=True),
            "leaseUntil": now + LEASE_SECONDS,
            "expiresAt": now + OUTBOX_TTL,
        }
        return {"Put": {"TableName": self.table_name, "Item": serialize(item)}}

    def enqueue(self, items: list[dict[str, Any]]) -> bool:
        """Write an alert's items in one transaction; False when the standing slot refused it."""
        try:
            transact(self.client, items, None, Backoff())
        except Cancelled:
            return False
        return True

    def pending_alerts(self, limit: int = 100) -> list[dict[str, Any]]:
        """Up to ``limit`` pending alerts whose lease has run out (in alert id order)."""
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "PK = :pk",
            "FilterExpression": "leaseUntil < :now",
            "ExpressionAttributeValues": serialize({":pk": OUTBOX_PK, ":now": int(self.clock())}),
            "ConsistentRead": True,
        }
        # MaxItems: no page is asked for once ``limit`` alerts are in hand.
        pages = self.client.get_paginator("query").paginate(
            **request, PaginationConfig={"MaxItems": limit}
        )
        return [deserialize(item) for page in pages for item in page.get("Items", [])]

    def lease_alert(self, alert_id: str) -> bool:
        """Take a pending alert over for publishing; False when another publisher holds it."""
        now = int(self.clock())
        return conditional(
            lambda: self.client.update_item(
                TableName=self.table_name,
                Key=serialize({"PK": OUTBOX_PK, "SK": alert_id}),
                UpdateExpression="SET leaseUntil = :until",
                ConditionExpression="attribute_exists(PK) AND leaseUntil < :now",
                ExpressionAttributeValues=serialize({":now": now, ":until": now + LEASE_SECONDS}),
            )
        )

    def alert_sent(self, alert_id: str) -> None:
        key = {"PK": OUTBOX_PK, "SK": alert_id}
        self.client.delete_item(TableName=self.table_name, Key=serialize(key))

    def release_puts(self, items: list[dict[str, Any]]) -> None:
        """Release the alerts that ``items`` (a transaction's, committed) put in the outbox:
        their writer is not the one that will publish them."""
        for item in items:
            put = item.get("Put", {})
            if put.get("TableName") == self.table_name and put["Item"]["PK"] == {"S": OUTBOX_PK}:
                self.release_alert(put["Item"]["SK"]["S"])

    def release_alert(self, alert_id: str) -> None:
        """Give a lease back after a failed publish, so the next retry may publish at once."""
        self.client.update_item(
            TableName=self.table_name,
            Key=serialize({"PK": OUTBOX_PK, "SK": alert_id}),
            UpdateExpression="SET leaseUntil = :zero",
            ConditionExpression="attribute_exists(PK)",
            ExpressionAttributeValues=serialize({":zero": 0}),
        )
