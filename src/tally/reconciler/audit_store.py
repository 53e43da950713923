"""The audit table: findings, repair log, markers, the alert outbox, standing findings and
sequence watermarks.

This module is the only code that knows the table's key design (docs/audit-table.md).
The table has no stream, so nothing written here ever reaches the reconciler again.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import Backoff, Cancelled, conditional, deserialize, serialize, transact
from tally.core.numbers import DYNAMODB
from tally.core.timefmt import epoch_iso
from tally.reconciler.findings import AlertMessage, Finding, Repair
from tally.reconciler.protocol.carry import Carry

DAY = 86_400
FINDING_TTL = 90 * DAY
REPAIR_TTL = 365 * DAY
# Longer than the stream's 24 h retention, so no redelivery can outlive its marker.
MARKER_TTL = 2 * DAY
# A pending alert outlives any retry path (stream retries, rechecks, the daily audit).
OUTBOX_TTL = 14 * DAY
OUTBOX_PK = "OUTBOX"
# How long a publisher holds a pending alert before another may take it over.
LEASE_SECONDS = 60
NEVER = 2**62
# A carry outlives the stream's 24 h retention, so no redelivery can add a record twice.
CARRY_TTL = 2 * DAY


class AuditStore:
    """Reads and writes the reconciler's state in the audit table."""

    def __init__(self, client: Any, table_name: str, clock: Callable[[], float] = time.time):
        self.client = client
        self.table_name = table_name
        self.clock = clock
        # Request units the carries consumed (reads and writes), for metrics and benchmarks.
        self.carry_units = Decimal(0)
        self._carry_lock = threading.Lock()

    # --- findings and repair log ---------------------------------------------------------

    def finding_put(self, finding: Finding) -> dict[str, Any]:
        """The finding's record as a ``TransactWriteItems`` Put: one item per finding id."""
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

    # --- repair markers ------------------------------------------------------------------

    def marker_put(
        self, marker: str, key: Mapping[str, str], written: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """A ``TransactWriteItems`` Put logging the marker a repair writes on ``key``, with the
        values it writes (``written``), which the repair's own stream record must show.

        It fails if the marker was logged before, so a TTL decrement applies once.
        """
        item = {
            "PK": f"MARKER#{marker}",
            "SK": "MARKER",
            "target": _key_json(key),
            "written": json.dumps({k: _canonical(v) for k, v in (written or {}).items()}),
            "expiresAt": self._expiry(MARKER_TTL),
        }
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
            shown = {name: _canonical(deserialize({name: image[name]})[name]) for name in written}
        except Exception:
            return False  # the record does not show what the repair wrote
        if item.get("target") != _key_json(key) or shown != written:
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

    # --- the alert outbox and standing findings -----------------------------------------

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

    def standing_put(self, finding: Finding, remind_seconds: int) -> dict[str, Any]:
        """A Put that fails while the same finding with the same outcome was already alerted.

        The standing slot holds one state per parent (one per number for gaps and
        duplicates): a changed state replaces it and is news; the same state is news again
        only after ``remind_seconds`` (0: never).
        """
        now = int(self.clock())
        item = {
            "PK": _parent_pk(finding),
            "SK": _standing_sk(finding),
            "alertKey": finding.alert_key,
            "findingId": finding.finding_id,
            "alertedAt": epoch_iso(now, "milliseconds"),
            "remindAt": now + remind_seconds if remind_seconds else NEVER,
            "expiresAt": now + FINDING_TTL,
        }
        return {
            "Put": {
                "TableName": self.table_name,
                "Item": serialize(item),
                "ConditionExpression": (
                    "attribute_not_exists(PK) OR alertKey <> :key OR remindAt < :now"
                ),
                "ExpressionAttributeValues": serialize({":key": finding.alert_key, ":now": now}),
            }
        }

    def alerted_at(self, finding: Finding) -> str | None:
        """When this finding (same broken state, any outcome) was alerted and still stands."""
        key = {"PK": _parent_pk(finding), "SK": _standing_sk(finding)}
        response = self.client.get_item(
            TableName=self.table_name, Key=serialize(key), ConsistentRead=True
        )
        slot = deserialize(response.get("Item") or {})
        if slot.get("findingId") != finding.finding_id:
            return None
        return str(slot.get("alertedAt") or "unknown")

    def standing_delete(self, finding: Finding) -> dict[str, Any]:
        """A Delete that ends the finding's standing slot (its repair applied)."""
        key = {"PK": _parent_pk(finding), "SK": _standing_sk(finding)}
        return {"Delete": {"TableName": self.table_name, "Key": serialize(key)}}

    def clear_standing(self, rule: str, key: Mapping[str, str]) -> None:
        """The parent was found consistent: a drift it had is over, so its return is news."""
        slot = {"PK": _pk(rule, key), "SK": f"STANDING#{_STATE}"}
        self.client.delete_item(TableName=self.table_name, Key=serialize(slot))

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
        found: list[dict[str, Any]] = []
        while len(found) < limit:
            response = self.client.query(**request)
            found += [deserialize(item) for item in response.get("Items", [])]
            if "LastEvaluatedKey" not in response:
                break
            request["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return found[:limit]

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

    def release_alert(self, alert_id: str) -> None:
        """Give a lease back after a failed publish, so the next retry may publish at once."""
        self.client.update_item(
            TableName=self.table_name,
            Key=serialize({"PK": OUTBOX_PK, "SK": alert_id}),
            UpdateExpression="SET leaseUntil = :zero",
            ConditionExpression="attribute_exists(PK)",
            ExpressionAttributeValues=serialize({":zero": 0}),
        )

    # --- sequence watermarks -------------------------------------------------------------

    def watermark(self, rule: str, key: Mapping[str, str]) -> int:
        """Every number up to here is verified present or voided; 0 when none is."""
        return self.sequence_state(rule, key)[0]

    def sequence_state(self, rule: str, key: Mapping[str, str]) -> tuple[int, int]:
        """The watermark, and the epoch: how many times the counter item was seen removed."""
        response = self.client.get_item(
            TableName=self.table_name,
            Key=serialize(_watermark_key(rule, key)),
            ConsistentRead=True,
        )
        item = deserialize(response.get("Item") or {})
        return int(item.get("watermark", 0)), int(item.get("epoch", 0))

    def end_sequence(self, rule: str, key: Mapping[str, str]) -> None:
        """The counter item was removed: its numbers are no horizon for a later life of the
        key. The watermark starts again at 0 and the epoch moves on."""
        self.client.update_item(
            TableName=self.table_name,
            Key=serialize(_watermark_key(rule, key)),
            UpdateExpression="SET watermark = :zero ADD epoch :one",
            ExpressionAttributeValues=serialize({":zero": 0, ":one": 1}),
        )

    def advance_watermark(self, rule: str, key: Mapping[str, str], to: int) -> bool:
        """Move the watermark forward to ``to``; False when it already stands there or beyond."""
        return conditional(
            lambda: self.client.update_item(
                TableName=self.table_name,
                Key=serialize(_watermark_key(rule, key)),
                UpdateExpression="SET watermark = :to",
                ConditionExpression="attribute_not_exists(watermark) OR watermark < :to",
                ExpressionAttributeValues=serialize({":to": to}),
            )
        )

    def lower_watermark(self, rule: str, key: Mapping[str, str], to: int) -> None:
        """Move the watermark back to ``to``: a number at or below it is no longer held."""
        conditional(
            lambda: self.client.update_item(
                TableName=self.table_name,
                Key=serialize(_watermark_key(rule, key)),
                UpdateExpression="SET watermark = :to",
                ConditionExpression="watermark > :to",
                ExpressionAttributeValues=serialize({":to": to}),
            )
        )

    # --- carries -------------------------------------------------------------------------

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

    # --- helpers -------------------------------------------------------------------------

    def _repair_item(self, finding: Finding, repair: Repair) -> dict[str, Any]:
        at = epoch_iso(self.clock(), "milliseconds")
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


def _canonical(value: Any) -> str:
    """A written value as the stream shows it back (DynamoDB drops a number's trailing zeros)."""
    return str(value.normalize(DYNAMODB)) if isinstance(value, Decimal) else json.dumps(value)


def _key_json(key: Mapping[str, str]) -> str:
    return json.dumps(dict(key), sort_keys=True, separators=(",", ":"))


def _pk(rule: str, key: Mapping[str, str]) -> str:
    return f"PARENT#{rule}#{_key_json(key)}"


def _parent_pk(finding: Finding) -> str:
    return _pk(finding.rule, finding.key)


_STATE = "state"


def _standing_sk(finding: Finding) -> str:
    """One slot per parent state; gaps and duplicates have one per number."""
    if finding.kind in ("gap", "duplicate"):
        return f"STANDING#{finding.kind}#{finding.number}"
    return f"STANDING#{_STATE}"


def _watermark_key(rule: str, key: Mapping[str, str]) -> dict[str, str]:
    return {"PK": f"SEQUENCE#{rule}#{_key_json(key)}", "SK": "WATERMARK"}


def _carry_key(rule: str, key: Mapping[str, str]) -> dict[str, str]:
    return {"PK": _pk(rule, key), "SK": "CARRY"}
