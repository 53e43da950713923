"""The stream's window in the audit table: the children found through an index the stream
showed changing under a parent lately, each as its latest record left it, so that a look
counts them so and not as an index that may lag shows them (docs/verification.md,
"Children found through an index")."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from tally.core.dynamodb import conditional, deserialize, serialize
from tally.reconciler.audit_table import AuditTable, key_json, parent_pk
from tally.reconciler.protocol.window import Noted, latest

PREFIX = "RECENT#"
# DynamoDB's limits on a partition and a sort key, in bytes: a key JSON past them (a key of
# non-ASCII text escapes to six bytes a character) is named by its digest instead.
MAX_PARTITION_KEY, MAX_SORT_KEY = 2048, 1024
# Sequence numbers are decimal strings of up to 40 digits: zero-padded, they compare as text.
SEQUENCE_DIGITS = 48


class AuditRecentChildren(AuditTable):
    """One item per (rule, parent, child) the stream showed changing: put as each batch is
    verified, read by each look at the parent, expiring after the rule's window."""

    def remember_children(
        self, rule: str, parent: Mapping[str, str], notes: Iterable[Noted], window: int
    ) -> None:
        """Note each child as its latest record left it, at the record's stream time (now
        when it has none, or one ahead of this clock). A note is replaced only by a later
        record's (a redelivered or retried batch cannot bring an older state back); a record
        older than the window (a replay of an old batch) is not noted: the index shows it."""
        now, pk = int(self.clock()), _notes_pk(rule, parent)
        for note in latest(notes).values():
            at = int(note.at) if 0 < note.at <= now else now
            if at < now - window:
                continue
            child = key_json(note.key)
            item: dict[str, Any] = {
                "PK": pk,
                "SK": _fitting(f"{PREFIX}{child}", MAX_SORT_KEY),
                "child": child,
                "seq": note.sequence_number.zfill(SEQUENCE_DIGITS),
                "at": at,
                "expiresAt": at + window,
            }
            if note.counted is not None:
                item["counted"] = note.counted
            if note.amount is not None:
                item["amount"] = note.amount
            if note.tokens:
                item["tokens"] = set(note.tokens)
            self._note(item)

    def _note(self, item: dict[str, Any]) -> None:
        conditional(
            lambda: self.client.put_item(
                TableName=self.table_name,
                Item=serialize(item),
                ConditionExpression="attribute_not_exists(SK) OR seq <= :seq",
                ExpressionAttributeValues=serialize({":seq": item["seq"]}),
                ReturnConsumedCapacity="TOTAL",
            )
        )

    def recent_children(self, rule: str, parent: Mapping[str, str], window: int) -> list[Noted]:
        """The children noted under ``parent`` within the last ``window`` seconds (one
        consistent ``Query``, paginated)."""
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "PK = :pk AND begins_with(SK, :prefix)",
            "ExpressionAttributeValues": serialize(
                {":pk": _notes_pk(rule, parent), ":prefix": PREFIX}
            ),
            "ConsistentRead": True,
            "ReturnConsumedCapacity": "TOTAL",
        }
        since = self.clock() - window
        notes: list[Noted] = []
        while True:
            response = self.client.query(**request)
            for raw in response.get("Items", []):
                item = deserialize(raw)
                if item.get("at", 0) < since:  # TTL deletes late: the window is told here
                    continue
                notes.append(
                    Noted(
                        json.loads(str(item["child"])),
                        str(int(str(item["seq"]))),
                        item.get("counted"),
                        item.get("amount"),
                        float(item["at"]),
                        tuple(sorted(str(t) for t in item.get("tokens", ()))),
                    )
                )
            if "LastEvaluatedKey" not in response:
                return notes
            request["ExclusiveStartKey"] = response["LastEvaluatedKey"]


def _notes_pk(rule: str, parent: Mapping[str, str]) -> str:
    """The parent's partition (``parent_pk``), or its digest when that is too long a key."""
    return _fitting(parent_pk(rule, parent), MAX_PARTITION_KEY)


def _fitting(key: str, limit: int) -> str:
    """``key``, or (past ``limit`` bytes) its prefix up to the first ``{`` and a digest."""
    if len(key.encode()) <= limit:
        return key
    head = key[: key.index("{")] if "{" in key else ""
    return f"{head}sha256:{hashlib.sha256(key.encode()).hexdigest()}"
