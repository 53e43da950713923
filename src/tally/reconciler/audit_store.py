"""The audit table: findings, repair log, alert claims, sequence watermarks, TTL markers.

This module is the only code that knows the table's key design (docs/audit-table.md).
The table has no stream, so nothing written here ever reaches the reconciler again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from tally.dynamodb import deserialize, serialize
from tally.reconciler.findings import Finding, Repair

DAY = 86_400
FINDING_TTL = 90 * DAY
REPAIR_TTL = 365 * DAY
ALERT_TTL = DAY
# Longer than the stream's 24 h retention, so no redelivery can outlive its marker.
TTL_MARKER_TTL = 2 * DAY


class AuditStore:
    """Reads and writes the reconciler's state in the audit table."""

    def __init__(self, client: Any, table_name: str, clock: Callable[[], float] = time.time):
        self.client = client
        self.table_name = table_name
        self.clock = clock

    # --- findings and repair log ---------------------------------------------------------

    def record_finding(self, finding: Finding) -> None:
        """Store the finding; the same finding id always lands on the same item."""
        body = finding.body()
        item: dict[str, Any] = {
            "PK": _parent_pk(finding),
            "SK": f"FINDING#{finding.finding_id}",
            "kind": finding.kind,
            "rule": finding.rule,
            "severity": finding.severity,
            "key": finding.key,
            "attribute": finding.attribute,
            "stored": finding.stored,
            "actual": finding.actual,
            "detectedAt": finding.detected_at,
            "repairStatus": body["repair"]["status"],
            "repairReason": body["repair"]["reason"],
            "body": json.dumps(body, sort_keys=True),
            "expiresAt": self._expiry(FINDING_TTL),
        }
        if finding.first_seen:
            item["firstSeen"] = finding.first_seen
        self.client.put_item(TableName=self.table_name, Item=serialize(item))

    def repair_put(self, finding: Finding, repair: Repair) -> dict[str, Any]:
        """The repair log entry as a ``TransactWriteItems`` Put, written with the repair."""
        return {
            "Put": {
                "TableName": self.table_name,
                "Item": serialize(self._repair_item(finding, repair)),
                "ConditionExpression": "attribute_not_exists(PK)",
            }
        }

    def record_repair(self, finding: Finding, repair: Repair) -> None:
        """Log a repair outcome that wrote nothing to the table (skipped, dry run, failed...)."""
        item = serialize(self._repair_item(finding, repair))
        self.client.put_item(TableName=self.table_name, Item=item)

    def findings(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every stored finding (``body`` parsed), newest first; for the CLI and tests."""
        items = self._scan("FINDING#", kind)
        for item in items:
            item["body"] = json.loads(item["body"])
        return sorted(items, key=lambda item: str(item["detectedAt"]), reverse=True)

    def repairs(self) -> list[dict[str, Any]]:
        """Every repair log entry, newest first."""
        return sorted(self._scan("REPAIR#"), key=lambda item: str(item["at"]), reverse=True)

    # --- alert de-duplication ------------------------------------------------------------

    def claim_alert(self, finding_id: str) -> bool:
        """Claim the right to alert on this finding; False when someone already has."""
        now = int(self.clock())
        item = {"PK": f"ALERT#{finding_id}", "SK": "ALERT", "expiresAt": now + ALERT_TTL}
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item=serialize(item),
                # TTL deletes lazily: a claim past its expiry must not block a new alert.
                ConditionExpression="attribute_not_exists(PK) OR expiresAt < :now",
                ExpressionAttributeValues=serialize({":now": now}),
            )
        except ClientError as error:
            if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def release_alert(self, finding_id: str) -> None:
        """Give a claim back, so that a retry can publish."""
        key = {"PK": f"ALERT#{finding_id}", "SK": "ALERT"}
        self.client.delete_item(TableName=self.table_name, Key=serialize(key))

    # --- sequence watermarks -------------------------------------------------------------

    def watermark(self, rule: str, key: Mapping[str, str]) -> int:
        """Every number up to here is verified present or voided; 0 when none is."""
        response = self.client.get_item(
            TableName=self.table_name,
            Key=serialize(_watermark_key(rule, key)),
            ConsistentRead=True,
        )
        item = deserialize(response.get("Item") or {})
        return int(item.get("watermark", 0))

    def advance_watermark(self, rule: str, key: Mapping[str, str], to: int) -> bool:
        """Move the watermark forward to ``to``; False when it already stands there or beyond."""
        try:
            self.client.update_item(
                TableName=self.table_name,
                Key=serialize(_watermark_key(rule, key)),
                UpdateExpression="SET watermark = :to",
                ConditionExpression="attribute_not_exists(watermark) OR watermark < :to",
                ExpressionAttributeValues=serialize({":to": to}),
            )
        except ClientError as error:
            if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    # --- TTL decrement markers -----------------------------------------------------------

    def ttl_marker_put(self, event_id: str) -> dict[str, Any]:
        """A ``TransactWriteItems`` Put that fails if this stream record was applied before."""
        item = {
            "PK": f"TTL#{event_id}",
            "SK": "APPLIED",
            "expiresAt": self._expiry(TTL_MARKER_TTL),
        }
        return {
            "Put": {
                "TableName": self.table_name,
                "Item": serialize(item),
                "ConditionExpression": "attribute_not_exists(PK)",
            }
        }

    # --- helpers -------------------------------------------------------------------------

    def _repair_item(self, finding: Finding, repair: Repair) -> dict[str, Any]:
        at = _iso(self.clock())
        return {
            "PK": _parent_pk(finding),
            "SK": f"REPAIR#{at}#{finding.finding_id}",
            "at": at,
            "kind": finding.kind,
            "rule": finding.rule,
            "key": finding.key,
            "findingId": finding.finding_id,
            "status": repair.status,
            "reason": repair.reason,
            "before": repair.before,
            "after": repair.after,
            "expiresAt": self._expiry(REPAIR_TTL),
        }

    def _expiry(self, seconds: int) -> int:
        return int(self.clock()) + seconds

    def _scan(self, prefix: str, kind: str | None = None) -> list[dict[str, Any]]:
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "FilterExpression": "begins_with(SK, :prefix)",
            "ExpressionAttributeValues": serialize({":prefix": prefix}),
            "ConsistentRead": True,
        }
        if kind is not None:
            request["FilterExpression"] += " AND #kind = :kind"
            request["ExpressionAttributeNames"] = {"#kind": "kind"}
            request["ExpressionAttributeValues"] |= serialize({":kind": kind})
        items: list[dict[str, Any]] = []
        while True:
            response = self.client.scan(**request)
            items += [deserialize(item) for item in response.get("Items", [])]
            if "LastEvaluatedKey" not in response:
                return items
            request["ExclusiveStartKey"] = response["LastEvaluatedKey"]


def _key_json(key: Mapping[str, str]) -> str:
    return json.dumps(dict(key), sort_keys=True, separators=(",", ":"))


def _parent_pk(finding: Finding) -> str:
    return f"PARENT#{finding.rule}#{_key_json(finding.key)}"


def _watermark_key(rule: str, key: Mapping[str, str]) -> dict[str, str]:
    return {"PK": f"SEQUENCE#{rule}#{_key_json(key)}", "SK": "WATERMARK"}


def _iso(epoch: float) -> str:
    return (
        datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )
