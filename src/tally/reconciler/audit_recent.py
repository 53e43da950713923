"""The recent-children window in the audit table: which children found through an index the
stream showed changing for a parent lately, so that a look counts them from the table, not
from an index that may not show them yet (docs/verification.md, "Children found through an
index")."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from tally.core.dynamodb import deserialize, serialize
from tally.reconciler.audit_table import AuditTable, key_json, parent_pk
from tally.rules import Key

PREFIX = "RECENT#"


class AuditRecentChildren(AuditTable):
    """One item per (rule, parent, child) the stream showed changing: put as each batch is
    verified, read by each look at the parent, expiring after the rule's window."""

    def remember_children(
        self, rule: str, parent: Mapping[str, str], children: Iterable[Key], window: int
    ) -> None:
        """Note that ``children`` changed under ``parent`` now (a redelivery notes it again)."""
        now = int(self.clock())
        for child in dict.fromkeys(key_json(c) for c in children):
            item = {
                "PK": parent_pk(rule, parent),
                "SK": f"{PREFIX}{child}",
                "at": now,
                "expiresAt": now + window,
            }
            self.client.put_item(
                TableName=self.table_name, Item=serialize(item), ReturnConsumedCapacity="TOTAL"
            )

    def recent_children(self, rule: str, parent: Mapping[str, str], window: int) -> list[Key]:
        """The children noted under ``parent`` within the last ``window`` seconds (one
        consistent ``Query``, paginated), by key."""
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "PK = :pk AND begins_with(SK, :prefix)",
            "ExpressionAttributeValues": serialize(
                {":pk": parent_pk(rule, parent), ":prefix": PREFIX}
            ),
            "ConsistentRead": True,
            "ReturnConsumedCapacity": "TOTAL",
        }
        since = self.clock() - window
        children: list[Key] = []
        while True:
            response = self.client.query(**request)
            for raw in response.get("Items", []):
                item = deserialize(raw)
                if item.get("at", 0) >= since:  # TTL deletes late: the window is told here
                    children.append(json.loads(str(item["SK"])[len(PREFIX) :]))
            if "LastEvaluatedKey" not in response:
                return children
            request["ExclusiveStartKey"] = response["LastEvaluatedKey"]
