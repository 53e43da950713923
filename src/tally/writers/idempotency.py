"""Idempotency keys: one guard item per key, committed in the same transaction as the request.

The guard holds a fingerprint of the request and the outcome it got (for allocations, also
the numbers and member keys). The same key with the same request is answered from the guard;
the same key with another request is a conflict. A guard answers for ``WINDOW_SECONDS``
(a day), then the key is free again; the table's TTL deletes it when the rules name the TTL
attribute. Guards live in the counted table (the writers may write nowhere else) under a
partition key no rule may claim.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from boto3.dynamodb.types import Binary

from tally.core.dynamodb import (
    Backoff,
    Cancelled,
    Committed,
    Names,
    deserialize,
    serialize,
    transact,
)
from tally.rules import Key, RuleSet
from tally.writers.errors import (
    IdempotencyConflictError,
    InvalidRequestError,
    ParentHomedElsewhereError,
)
from tally.writers.items import binary, utf8_length
from tally.writers.mrsc import Consistency, StrongWrites, check_consistency
from tally.writers.regional import homed_elsewhere, stamped
from tally.writers.transactions import new_token

GUARD_PREFIX = "tallyIdempotency#"
WINDOW_SECONDS = 24 * 3600
MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class Keyed:
    """A request made under an idempotency key."""

    key: str
    fingerprint: str


@dataclass(frozen=True)
class Record:
    """What the guard says the key's request got."""

    fingerprint: str
    outcome: str
    numbers: tuple[int, ...] = ()
    member_keys: tuple[Key, ...] = ()


class Guards:
    """The guard items of one table."""

    def __init__(self, client: Any, table_name: str, rules: RuleSet, backoff: Backoff):
        self.client = client
        self.table_name = table_name
        self.backoff = backoff
        self.clock = time.time
        self._keys = rules.table
        self._expiry = rules.table.ttl_attribute or "expiresAt"
        sample = self._key("0" * 64)
        if rules.classify(sample):
            raise ValueError(f"a rule claims {sample}: keys starting {GUARD_PREFIX!r} are reserved")

    def request(self, idempotency_key: str | None, operation: str, *body: Any) -> Keyed | None:
        """The keyed request, or None without a key; the key is 1..255 characters."""
        if idempotency_key is None:
            return None
        field = ("idempotency_key",)
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise InvalidRequestError(field, "must be a non-empty string")
        utf8_length(idempotency_key, field)
        if len(idempotency_key) > MAX_KEY_LENGTH:
            raise InvalidRequestError(field, f"must be at most {MAX_KEY_LENGTH} characters")
        return Keyed(idempotency_key, fingerprint(operation, *body))

    def put(
        self,
        keyed: Keyed,
        outcome: str,
        numbers: Sequence[int] = (),
        member_keys: Sequence[Key] = (),
    ) -> dict[str, Any]:
        """The guard's conditional Put, for the request's own transaction."""
        item: dict[str, Any] = {
            **self._key(_digest(keyed.key)),
            "fingerprint": keyed.fingerprint,
            "outcome": outcome,
            self._expiry: Decimal(int(self.clock()) + WINDOW_SECONDS),
        }
        if numbers:
            item["numbers"] = [Decimal(n) for n in numbers]
            item["memberKeys"] = [dict(key) for key in member_keys]
        names = Names.of(self._keys.partition_key, self._expiry)
        return {
            "Put": {
                "TableName": self.table_name,
                "Item": serialize(self._keys.typed(item)),
                "ConditionExpression": f"attribute_not_exists({names[self._keys.partition_key]})"
                f" OR {names[self._expiry]} < :now",
                "ExpressionAttributeNames": names.expression_names,
                "ExpressionAttributeValues": serialize({":now": Decimal(int(self.clock()))}),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def taken(self, cancelled: Cancelled, index: int) -> Record | None:
        """The guard that cancelled a transaction at ``index``, if it did."""
        if not cancelled.failed(index):
            return None
        return self._record(cancelled.old_item(index) or {})

    def read(self, keyed: Keyed) -> Record | None:
        """The key's live guard, if any (consistent read)."""
        response = self.client.get_item(
            TableName=self.table_name,
            Key=serialize(self._keys.typed(self._key(_digest(keyed.key)))),
            ConsistentRead=True,
        )
        item = deserialize(response["Item"]) if "Item" in response else None
        if item is None or item.get(self._expiry, 0) < int(self.clock()):
            return None
        return self._record(item)

    def record(
        self,
        keyed: Keyed,
        outcome: str,
        numbers: Sequence[int] = (),
        member_keys: Sequence[Key] = (),
    ) -> Record | None:
        """Store an outcome that wrote nothing else; the key's existing guard if it has one.

        A one-item transaction, so botocore's retry after a lost response is a replay.
        """
        try:
            transact(
                self.client,
                [self.put(keyed, outcome, numbers, member_keys)],
                new_token(),
                self.backoff,
            )
        except Cancelled as cancelled:
            return self.taken(cancelled, 0)
        return None

    def answer(self, keyed: Keyed, record: Record) -> Record:
        """The stored outcome for this request; a conflict if the key served another one."""
        if record.fingerprint != keyed.fingerprint:
            raise IdempotencyConflictError(
                keyed.key,
                "mismatch",
                f"was used for a different request ({record.outcome}); "
                "a key may carry one request only",
            )
        return record

    def _key(self, digest: str) -> Key:
        key = {self._keys.partition_key: GUARD_PREFIX + digest}
        if self._keys.sort_key:
            # A number sort key takes -1: collections number their members from 1.
            numeric = self._keys.numeric(self._keys.sort_key)
            key[self._keys.sort_key] = "-1" if numeric else "tallyIdempotency"
        return key

    def _record(self, item: Mapping[str, Any]) -> Record:
        return Record(
            str(item.get("fingerprint")),
            str(item.get("outcome")),
            tuple(int(n) for n in item.get("numbers", ())),
            tuple(dict(key) for key in item.get("memberKeys", ())),
        )


class GuardedWriter:
    """A writer of one table: its client, name and rules, the backoff between optimistic
    rounds, and the guards of the idempotency keys its requests carry.

    ``consistency="strong"``: the table is a multi-Region strongly consistent (MRSC) Global
    Table, which refuses transactions; the writers then never send one (``tally.writers.mrsc``).
    """

    def __init__(
        self,
        client: Any,
        table_name: str,
        rules: RuleSet,
        backoff: Backoff | None = None,
        *,
        region: str | None = None,
        consistency: Consistency = "eventual",
    ):
        self.client = client
        self.table_name = table_name
        self.rules = rules
        self.backoff = backoff or Backoff()
        self.guards = Guards(client, table_name, rules, self.backoff)
        self._keys = rules.table
        self._pk = rules.table.partition_key
        # On a multi-Region table, the Region this writer writes in: every write then leaves
        # the evidence ``tally.core.regions`` names. None: a single-Region table, as ever.
        self.region = region
        self.consistency = check_consistency(consistency)
        self.strong: StrongWrites | None = None
        if consistency == "strong":
            self.strong = StrongWrites(client, table_name, rules.table, self.backoff, region)

    def _transact(self, actions: list[dict[str, Any]], token: str | None) -> Committed:
        """Commit the actions (stamped with this writer's Region, if it has one)."""
        if self.strong is not None:
            raise RuntimeError("a writer of an MRSC table never sends a transaction")
        if self.region is None:
            return transact(self.client, actions, token, self.backoff)
        actions = stamped(actions, self.region)
        try:
            return transact(self.client, actions, token, self.backoff)
        except Cancelled as cancelled:
            for index, action in enumerate(actions):
                update = action.get("Update")
                if update is None or not cancelled.failed(index):
                    continue
                if home := homed_elsewhere(cancelled.old_item(index), self.region):
                    key = deserialize(update["Key"])
                    raise ParentHomedElsewhereError(key, home, self.region) from None
            raise

    def _key(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """The item (or key) serialized, number key attributes as numbers."""
        return serialize(self._keys.typed(item))

    def _on_key(
        self, action: Literal["Put", "Delete"], item: Mapping[str, Any], **options: str
    ) -> dict[str, Any]:
        """A transaction's Put of the item, only where no item has its key yet, or Delete of
        the item under a key, only where there is one."""
        put = action == "Put"
        names = Names.of(self._pk)
        test = "attribute_not_exists" if put else "attribute_exists"
        return {
            action: {
                "TableName": self.table_name,
                "Item" if put else "Key": self._key(item),
                "ConditionExpression": f"{test}({names[self._pk]})",
                "ExpressionAttributeNames": names.expression_names,
                **options,
            }
        }


def fingerprint(*parts: Any) -> str:
    """A digest of the request: typed like DynamoDB JSON, so "5" and 5 differ; sets sorted."""
    text = json.dumps(_typed(list(parts)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _typed(value: Any) -> Any:
    if isinstance(value, bool):
        return {"BOOL": value}
    if value is None:
        return {"NULL": True}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, Decimal | int):
        return {"N": str(value)}
    if isinstance(value, bytes | bytearray | Binary):
        return {"B": base64.b64encode(binary(value)).decode()}
    if isinstance(value, Mapping):
        return {"M": {str(k): _typed(v) for k, v in value.items()}}
    if isinstance(value, Set):
        return {"SET": sorted(json.dumps(_typed(v), sort_keys=True) for v in value)}
    return {"L": [_typed(v) for v in value]}
