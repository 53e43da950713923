"""Sequence watermarks in the audit table: how far each sequence is verified, and its epoch."""

from __future__ import annotations

from collections.abc import Mapping

from tally.core.dynamodb import conditional, deserialize, serialize
from tally.reconciler.store.items import StorePart, key_json


class Watermarks(StorePart):
    """Each sequence's watermark and epoch, moved forward or back by condition."""

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
        return self._move_watermark(
            rule, key, to, "attribute_not_exists(watermark) OR watermark < :to"
        )

    def lower_watermark(self, rule: str, key: Mapping[str, str], to: int) -> None:
        """Move the watermark back to ``to``: a number at or below it is no longer held."""
        self._move_watermark(rule, key, to, "watermark > :to")

    def _move_watermark(self, rule: str, key: Mapping[str, str], to: int, when: str) -> bool:
        return conditional(
            lambda: self.client.update_item(
                TableName=self.table_name,
                Key=serialize(_watermark_key(rule, key)),
                UpdateExpression="SET watermark = :to",
                ConditionExpression=when,
                ExpressionAttributeValues=serialize({":to": to}),
            )
        )


def _watermark_key(rule: str, key: Mapping[str, str]) -> dict[str, str]:
    return {"PK": f"SEQUENCE#{rule}#{key_json(key)}", "SK": "WATERMARK"}
