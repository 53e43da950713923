"""The log of findings and repairs, and the repair markers, in the audit table."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError

from tally.core.dynamodb import Backoff, Cancelled, conditional, deserialize, serialize, transact
from tally.core.timefmt import epoch_iso
from tally.reconciler.findings import Finding, Repair
from tally.reconciler.store.items import (
    DAY,
    FINDING_TTL,
    StorePart,
    canonical,
    finding_pk,
    key_json,
    parent_pk,
)

REPAIR_TTL = 365 * DAY
# Longer than the stream's 24 h retention, so no redelivery can outlive its marker.
MARKER_TTL = 2 * DAY


class FindingLog(StorePart):
    """Findings, the repair log and repair markers."""

    # --- findings and repair log ---------------------------------------------------------

    def finding_put(self, finding: Finding) -> dict[str, Any]:
        """The finding's record as a ``TransactWriteItems`` Put: one item per finding id."""
        body = finding.body()
        item: dict[str, Any] = {
            "PK": finding_pk(finding),
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
        return {"Put": {"TableName": self.table_name, "Item": serialize(item)}}

    def repair_put(self, finding: Finding, repair: Repair) -> dict[str, Any]:
        """The repair log entry as a ``TransactWriteItems`` Put, written with the repair."""
        return {
            "Put": {
                "TableName": self.table_name,
                "Item": serialize(self._repair_item(finding, repair)),
                "ConditionExpression": "attribute_not_exists(PK)",
            }
        }

    def findings(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every stored finding (``body`` parsed), newest first; for the CLI and tests."""
        items = self._scan("FINDING#", kind)
        for item in items:
            item["body"] = json.loads(item["body"])
        return sorted(items, key=lambda item: str(item["detectedAt"]), reverse=True)

    def repairs(self) -> list[dict[str, Any]]:
        """Every repair log entry, newest first."""
        return sorted(self._scan("REPAIR#"), key=lambda item: str(item["at"]), reverse=True)

    def repairs_since(self, rule: str, key: Mapping[str, str], since: float) -> int:
        """How many repairs of one parent were applied since ``since`` (epoch seconds)."""
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "PK = :pk AND SK BETWEEN :from AND :to",
            "FilterExpression": "#status = :applied",
            "ExpressionAttributeNames": {"#status": "status"},
            "ExpressionAttributeValues": serialize(
                {
                    ":pk": parent_pk(rule, key),
                    ":from": f"REPAIR#{epoch_iso(since, 'milliseconds')}",
                    ":to": "REPAIR#~",
                    ":applied": "applied",
                }
            ),
            "Select": "COUNT",
            "ConsistentRead": True,
        }
        pages = self.client.get_paginator("query").paginate(**request)
        return sum(int(page["Count"]) for page in pages)

    # --- repair markers ------------------------------------------------------------------

    def marker_put(
        self,
        marker: str,
        key: Mapping[str, str],
        written: Mapping[str, Any] | None = None,
        pending: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A ``TransactWriteItems`` Put logging the marker a repair writes on ``key``, with the
        values it writes (``written``), which the repair's own stream record must show;
        ``pending``: the audit items that finish a repair written apart (``finish_repair``).

        It fails if the marker was logged before, so a TTL decrement applies once.
        """
        item = {
            "PK": f"MARKER#{marker}",
            "SK": "MARKER",
            "target": key_json(key),
            "written": json.dumps({k: canonical(v) for k, v in (written or {}).items()}),
            "expiresAt": self._expiry(MARKER_TTL),
        }
        if pending is not None:
            item["pending"] = json.dumps(list(pending))
        return {
            "Put": {
                "TableName": self.table_name,
                "Item": serialize(item),
                "ConditionExpression": "attribute_not_exists(PK)",
            }
        }

    def confirm_marker(
        self,
        marker: str,
        key: Mapping[str, str],
        image: Mapping[str, Any],
        sequence_number: str,
    ) -> bool:
        """True when a logged repair wrote this marker on this key with the values ``image``
        (the record's new image) shows, and this record is the one that claims it.

        Any client can write the marker attribute, even a value it read from a real repair;
        only the audit table knows which values the reconciler wrote, and each is claimed by
        one stream record (a redelivery of that record included).
        """
        logged = self.client.get_item(
            TableName=self.table_name,
            Key=serialize({"PK": f"MARKER#{marker}", "SK": "MARKER"}),
            ConsistentRead=True,
        ).get("Item")
        if logged is None:
            return False
        item = deserialize(logged)
        written = json.loads(item.get("written") or "{}")
        try:
            shown = {name: canonical(deserialize({name: image[name]})[name]) for name in written}
        except Exception:
            return False  # the record does not show what the repair wrote
        if item.get("target") != key_json(key) or shown != written:
            return False
        return conditional(
            lambda: self.client.update_item(
                TableName=self.table_name,
                Key=serialize({"PK": f"MARKER#{marker}", "SK": "MARKER"}),
                UpdateExpression="SET #seen = :seq",
                ConditionExpression="attribute_not_exists(#seen) OR #seen = :seq",
                ExpressionAttributeNames={"#seen": "seenSequence"},
                ExpressionAttributeValues=serialize({":seq": sequence_number}),
            )
        )

    def put_marker(self, put: Mapping[str, Any]) -> None:
        """Write a ``marker_put`` alone (a repair written apart: before its write). The marker
        is fresh and random: a condition that fails is botocore's resend of this very put
        after a lost answer, which landed."""
        try:
            self.client.put_item(**put["Put"])
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise

    def pending_repair(self, marker: str) -> list[dict[str, Any]]:
        """The audit items a repair written apart still owes ([] once finished, or none)."""
        found = self.client.get_item(
            TableName=self.table_name,
            Key=serialize({"PK": f"MARKER#{marker}", "SK": "MARKER"}),
            ConsistentRead=True,
        ).get("Item", {})
        pending = found.get("pending", {}).get("S")
        return list(json.loads(pending)) if pending else []

    def finish_repair(self, marker: str, pending: Sequence[Mapping[str, Any]]) -> bool:
        """Commit a repair's ``pending`` audit items with the end of its marker's pending
        state, once: False when another finished it first (its write's stream record, or the
        repair itself)."""
        done = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize({"PK": f"MARKER#{marker}", "SK": "MARKER"}),
                "UpdateExpression": "REMOVE #pending",
                "ConditionExpression": "attribute_exists(#pending)",
                "ExpressionAttributeNames": {"#pending": "pending"},
            }
        }
        try:
            transact(self.client, [*pending, done], None, Backoff())
        except Cancelled:
            return False
        return True

    # --- helpers -------------------------------------------------------------------------

    def _repair_item(self, finding: Finding, repair: Repair) -> dict[str, Any]:
        at = epoch_iso(self.clock(), "milliseconds")
        return {
            "PK": finding_pk(finding),
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
        pages = self.client.get_paginator("scan").paginate(**request)
        return [deserialize(item) for page in pages for item in page.get("Items", [])]
