"""Standing findings in the audit table: one alerted state per parent, so news alerts once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tally.core.dynamodb import deserialize, serialize
from tally.core.timefmt import epoch_iso
from tally.reconciler.findings import Finding
from tally.reconciler.store.items import FINDING_TTL, StorePart, finding_pk, parent_pk

NEVER = 2**62
_STATE = "state"


class StandingFindings(StorePart):
    """The standing slot of each alerted finding: put by condition, read, ended."""

    def standing_put(self, finding: Finding, remind_seconds: int) -> dict[str, Any]:
        """A Put that fails while the same finding with the same outcome was already alerted.

        The standing slot holds one state per parent (one per number for gaps and
        duplicates): a changed state replaces it and is news; the same state is news again
        only after ``remind_seconds`` (0: never).
        """
        now = int(self.clock())
        item = {
            "PK": finding_pk(finding),
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
        key = {"PK": finding_pk(finding), "SK": _standing_sk(finding)}
        response = self.client.get_item(
            TableName=self.table_name, Key=serialize(key), ConsistentRead=True
        )
        slot = deserialize(response.get("Item") or {})
        if slot.get("findingId") != finding.finding_id:
            return None
        return str(slot.get("alertedAt") or "unknown")

    def standing_delete(self, finding: Finding) -> dict[str, Any]:
        """A Delete that ends the finding's standing slot (its repair applied)."""
        key = {"PK": finding_pk(finding), "SK": _standing_sk(finding)}
        return {"Delete": {"TableName": self.table_name, "Key": serialize(key)}}

    def clear_standing(self, rule: str, key: Mapping[str, str]) -> None:
        """The parent was found consistent: a drift it had is over, so its return is news."""
        slot = {"PK": parent_pk(rule, key), "SK": f"STANDING#{_STATE}"}
        self.client.delete_item(TableName=self.table_name, Key=serialize(slot))


def _standing_sk(finding: Finding) -> str:
    """One slot per parent state; gaps and duplicates have one per number."""
    if finding.kind in ("gap", "duplicate"):
        return f"STANDING#{finding.kind}#{finding.number}"
    return f"STANDING#{_STATE}"
