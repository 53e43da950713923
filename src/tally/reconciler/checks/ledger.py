"""The member ledger: which member holds which number, for attribute-layout sequences.

Members keyed by a natural key (``User#Kirk``) carry their number in an attribute, and no
key or index leads from a number to its member. The reconciler keeps the mapping in the
audit table from the stream, and the full audit rebuilds it from a scan
(docs/audit-table.md). Every write is conditioned on the stream order, so a redelivered or
replayed record never undoes a later one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import conditional, deserialize, serialize
from tally.reconciler.stream.changes import LedgerChange
from tally.rules import Key, SequenceRule

# Stream sequence numbers are decimal strings of up to 40 digits: padded, they sort as text.
_SEQ_WIDTH = 48
# What the full audit writes: older than any stream record, so the stream's word wins.
_REBUILT = "0" * _SEQ_WIDTH


class MemberLedger:
    """The ledger's items in the audit table: one per (number, member)."""

    def __init__(self, client: Any, table_name: str):
        self.client = client
        self.table_name = table_name

    def record(self, rule: SequenceRule, counter: Key, changes: Iterable[LedgerChange]) -> None:
        """Apply a batch's member changes in stream order (idempotent under redelivery)."""
        for change in changes:
            seq = change.sequence_number.zfill(_SEQ_WIDTH)
            if change.before is not None:
                self._put(rule, counter, change.before, change.key, False, seq)
            if change.after is not None:
                self._put(rule, counter, change.after, change.key, True, seq)

    def members(self, rule: SequenceRule, counter: Key, above: int) -> list[tuple[int, Key]]:
        """Members holding a number above ``above``, ascending (a consistent query)."""
        return [
            (int(item["number"]), dict(item["member"]))
            for item in self._entries(rule, counter, above)
            if item["held"]
        ]

    def rebuild(
        self,
        rule: SequenceRule,
        counter: Key,
        scanned: Iterable[tuple[int, Key]],
        number_of: Callable[[Key], int | None],
    ) -> tuple[int, list[int]]:
        """Make the ledger agree with a scan: add what it missed, drop what no longer holds.

        A scan is no snapshot, so nothing is taken on its word alone: an entry is added only
        where the ledger has none, and dropped only after a consistent read of the member,
        conditioned on the entry not having moved since. Returns how many entries were added,
        and the numbers dropped.
        """
        seen = {(number, _key_json(key)) for number, key in scanned}
        added, dropped = 0, []
        for number, key_json in sorted(seen):
            added += self._put(rule, counter, number, json.loads(key_json), True, _REBUILT, True)
        for item in self._entries(rule, counter, 0):
            member = dict(item["member"])
            number = int(item["number"])
            if not item["held"] or (number, _key_json(member)) in seen:
                continue
            if number_of(member) != number and self._drop(rule, counter, item):
                dropped.append(number)
        return added, dropped

    def _put(
        self,
        rule: SequenceRule,
        counter: Key,
        number: int,
        member: Key,
        held: bool,
        seq: str,
        only_new: bool = False,
    ) -> bool:
        condition = "attribute_not_exists(PK)"
        if not only_new:
            condition += " OR seq <= :seq"  # a redelivery rewrites the same; older never wins
        item = _ledger_key(rule, counter, number, member) | {
            "number": Decimal(number),
            "member": dict(member),
            "held": held,
            "seq": seq,
        }
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "Item": serialize(item),
            "ConditionExpression": condition,
        }
        if not only_new:
            request["ExpressionAttributeValues"] = serialize({":seq": seq})
        return conditional(lambda: self.client.put_item(**request))

    def _drop(self, rule: SequenceRule, counter: Key, item: Mapping[str, Any]) -> bool:
        key = _ledger_key(rule, counter, int(item["number"]), dict(item["member"]))
        return conditional(
            lambda: self.client.update_item(
                TableName=self.table_name,
                Key=serialize(key),
                UpdateExpression="SET held = :no",
                ConditionExpression="seq = :seq",
                ExpressionAttributeValues=serialize({":no": False, ":seq": item["seq"]}),
            )
        )

    def _entries(self, rule: SequenceRule, counter: Key, above: int) -> list[dict[str, Any]]:
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table_name,
            KeyConditionExpression="PK = :pk AND SK > :above",
            ExpressionAttributeValues=serialize(
                {":pk": _ledger_pk(rule, counter), ":above": f"{above:020d}#~"}
            ),
            ConsistentRead=True,
        )
        return [deserialize(raw) for page in pages for raw in page["Items"]]


def _key_json(key: Mapping[str, str]) -> str:
    return json.dumps(dict(key), sort_keys=True, separators=(",", ":"))


def _ledger_pk(rule: SequenceRule, counter: Key) -> str:
    return f"LEDGER#{rule.name}#{_key_json(counter)}"


def _ledger_key(rule: SequenceRule, counter: Key, number: int, member: Key) -> dict[str, str]:
    return {"PK": _ledger_pk(rule, counter), "SK": f"{number:020d}#{_key_json(member)}"}
