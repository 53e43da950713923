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
from tally.reconciler.protocol.window import Noted, latest
from tally.reconciler.store.items import StorePart, key_json, parent_pk

PREFIX = "RECENT#"
# DynamoDB's limits on a partition and a sort key, in bytes: a key JSON past them (a key of
# non-ASCII text escapes to six bytes a character) is named by its digest instead.
MAX_PARTITION_KEY, MAX_SORT_KEY = 2048, 1024
# Sequence numbers are decimal strings of up to 40 digits: zero-padded, they compare as text.
SEQUENCE_DIGITS = 48
# A note's attributes its record may lack (a put would drop them; an update removes them).
OPTIONAL = ("counted", "amount", "tokens")


class RecentChildren(StorePart):
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
        """Put the note over an older one, keeping that one's tokens as ``prior``: a record
        that brings an old token back (an item written back as it stood) must not hide the
        change before it from a look (each token a note holds was shown by a record no later
        than its own: docs/verification.md, "Parents that never rest")."""
        key = {"PK": item.pop("PK"), "SK": item.pop("SK")}
        names, values, sets, removes = {}, {":seq": item["seq"], ":none": ""}, [], []
        for n, name in enumerate(("child", "seq", "at", "expiresAt", *OPTIONAL)):
            names[f"#n{n}"] = name
            if name in item:
                values[f":v{n}"] = item[name]
                sets.append(f"#n{n} = :v{n}")
            else:
                removes.append(f"#n{n}")
        names["#prior"], names["#tokens"] = "prior", "tokens"
        sets.append("#prior = if_not_exists(#tokens, :none)")
        expression = f"SET {', '.join(sets)}" + (f" REMOVE {', '.join(removes)}" if removes else "")
        conditional(
            lambda: self.client.update_item(
                TableName=self.table_name,
                Key=serialize(key),
                UpdateExpression=expression,
                ConditionExpression="attribute_not_exists(SK) OR seq <= :seq",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=serialize(values),
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
        for page in self.client.get_paginator("query").paginate(**request):
            for raw in page.get("Items", []):
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
                        _tokens(item),
                    )
                )
        return notes


def _tokens(item: Mapping[str, Any]) -> tuple[str, ...]:
    """The tokens a note's record showed, with those of the note it replaced (``prior``)."""
    held = [item.get(name) for name in ("tokens", "prior")]
    return tuple(sorted({str(t) for h in held if isinstance(h, set | frozenset) for t in h}))


def _notes_pk(rule: str, parent: Mapping[str, str]) -> str:
    """The parent's partition (``parent_pk``), or its digest when that is too long a key."""
    return _fitting(parent_pk(rule, parent), MAX_PARTITION_KEY)


def _fitting(key: str, limit: int) -> str:
    """``key``, or (past ``limit`` bytes) its prefix up to the first ``{`` and a digest."""
    if len(key.encode()) <= limit:
        return key
    head = key[: key.index("{")] if "{" in key else ""
    return f"{head}sha256:{hashlib.sha256(key.encode()).hexdigest()}"
