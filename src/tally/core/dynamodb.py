"""DynamoDB primitives shared by writers and reconciler: (de)serializing, expression names,
and running one ``TransactWriteItems`` with the caller's ``ClientRequestToken``, conflict retries
and cancellation reasons."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, cast

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from tally.core.numbers import DIGITS, DYNAMODB, parse


class Deserializer(TypeDeserializer):
    """boto3's deserializer, reading numbers exactly.

    DynamoDB writes a number such as 1E+38 as 39 digits; boto3 parses it in a 38-digit
    context that traps Rounded, and raises. Here it is read whole, and a number outside
    the domain (which no DynamoDB item holds) still raises.
    """

    def deserialize(self, value: Any) -> Any:
        if value.__class__ is dict and len(value) == 1:
            # The hot path, numbers and strings, without boto3's dispatch by name.
            if "N" in value:
                return self._deserialize_n(value["N"])
            if "S" in value:
                return value["S"]
        return super().deserialize(value)

    def _deserialize_n(self, value: str) -> Decimal:
        if len(value) > DIGITS:
            return parse(value)
        number = DYNAMODB.create_decimal(
            value
        )  # DecimalException outside the domain, as boto3's does
        return number if number.is_finite() else parse(value)

    def _deserialize_ns(self, value: Iterable[str]) -> set[Decimal]:
        return {parse(v) for v in value}


class Serializer(TypeSerializer):
    """boto3's serializer, writing every number DynamoDB holds.

    boto3 checks a number in a context whose smallest exponent is -128: a 38-digit number
    just above 1E-130 (which DynamoDB holds, and a foreign writer may have written) raises
    Underflow there. Here the check is DynamoDB's own domain (core.numbers); a number outside
    it, or one that would lose a digit, still raises.
    """

    def _serialize_n(self, value: Any) -> str:
        number = str(DYNAMODB.create_decimal(value))
        if number in ("Infinity", "NaN", "-Infinity", "sNaN"):
            raise TypeError("Infinity and NaN not supported")
        return number


_SERIALIZER = Serializer()
_DESERIALIZER = Deserializer()  # numbers read exactly, 1E+38 and up included
# Cancellation codes that say "try the same thing again", not "your condition failed".
_TRANSIENT = {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}


def serialize(item: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _SERIALIZER.serialize(value) for name, value in item.items()}


def deserialize(item: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _DESERIALIZER.deserialize(value) for name, value in item.items()}


class TransactionFailedError(RuntimeError):
    """A transaction was cancelled for a reason the caller cannot turn into an outcome."""

    def __init__(self, reasons: list[dict[str, Any]], attempts: int):
        codes = [reason.get("Code") for reason in reasons]
        super().__init__(f"transaction cancelled after {attempts} attempt(s): {codes}")
        self.reasons = reasons
        self.attempts = attempts


@dataclass(frozen=True)
class Backoff:
    """Bounded retries: full jitter for transaction conflicts, short rounds for lost races.

    A conflict says "someone is busy here": back off. A lost optimistic round (the counter
    moved since it was read) says "someone made progress" and brings the fresh value, so
    the next round starts at once; with many writers on one gapless counter, losing
    rounds is normal, hence the generous bound that only stops a livelock.
    """

    attempts: int = 16
    base_seconds: float = 0.01
    cap_seconds: float = 0.25
    rounds: int = 1000

    def pause(self, attempt: int) -> None:
        time.sleep(random.uniform(0, min(self.cap_seconds, self.base_seconds * 2**attempt)))


@dataclass(frozen=True)
class Committed:
    """A committed transaction; ``replayed`` when DynamoDB recognised the token and did nothing."""

    replayed: bool
    attempts: int


class Cancelled(Exception):
    """The transaction was cancelled by a condition; ``reasons`` line up with the items."""

    def __init__(self, reasons: list[dict[str, Any]], attempts: int):
        super().__init__(f"cancelled: {[r.get('Code') for r in reasons]}")
        self.reasons = reasons
        self.attempts = attempts

    def failed(self, index: int) -> bool:
        return self.reasons[index].get("Code") == "ConditionalCheckFailed"

    def old_item(self, index: int) -> dict[str, Any] | None:
        """The item as it was when its condition failed (needs ALL_OLD on that item)."""
        item = self.reasons[index].get("Item")
        return deserialize(item) if item else None

    def unexpected(self) -> TransactionFailedError:
        return TransactionFailedError(self.reasons, self.attempts)


def transact(
    client: Any,
    items: Sequence[Mapping[str, Any]],
    token: str | None,
    backoff: Backoff,
) -> Committed:
    """Run the transaction, retrying conflicts; raise ``Cancelled`` when a condition failed."""
    request: dict[str, Any] = {"TransactItems": list(items), "ReturnConsumedCapacity": "TOTAL"}
    if token is not None:
        request["ClientRequestToken"] = token
    for attempt in range(1, backoff.attempts + 1):
        try:
            response = client.transact_write_items(**request)
        except ClientError as error:
            reasons = cast(list[dict[str, Any]], error.response.get("CancellationReasons") or [])
            code = error.response["Error"]["Code"]
            if reasons and any(r.get("Code") == "ConditionalCheckFailed" for r in reasons):
                raise Cancelled(reasons, attempt) from error
            # One layer owns each retry. botocore, in every retry mode, resends a refused
            # request (TransactionInProgressException, the request throttled, 5xx, the
            # network) up to its max_attempts, and never a TransactionCanceledException (no
            # retry code of its, not modelled retryable). So this loop retries only a
            # cancellation whose every reason is transient, and never resends what botocore
            # gave up on: a conflict costs ``backoff.attempts`` sends at most, a token still
            # in progress botocore's max_attempts, never the two multiplied.
            retryable = bool(reasons) and {r.get("Code") for r in reasons} <= _TRANSIENT | {"None"}
            if not retryable or attempt == backoff.attempts:
                raise TransactionFailedError(reasons or [{"Code": code}], attempt) from error
            backoff.pause(attempt)
            continue
        return Committed(replayed=_is_replay(response), attempts=attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def conditional(write: Callable[[], Any]) -> bool:
    """Run one conditional write; False when its condition failed (DynamoDB wrote nothing)."""
    try:
        write()
    except ClientError as error:
        if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return False
        raise
    return True


def _is_replay(response: Mapping[str, Any]) -> bool:
    # A repeated token is answered with read units only: nothing was written this time.
    consumed = response.get("ConsumedCapacity") or []
    return bool(consumed) and all(not c.get("WriteCapacityUnits") for c in consumed)


@dataclass(frozen=True)
class Names:
    """``ExpressionAttributeNames`` for a set of attribute names, as ``#a0``, ``#a1``..."""

    mapping: dict[str, str]

    @classmethod
    def of(cls, *attributes: str | None) -> Names:
        present = [a for a in dict.fromkeys(attributes) if a is not None]
        return cls({name: f"#a{i}" for i, name in enumerate(present)})

    def __getitem__(self, attribute: str) -> str:
        return self.mapping[attribute]

    @property
    def expression_names(self) -> dict[str, str]:
        return {placeholder: name for name, placeholder in self.mapping.items()}

    def subset(self, *attributes: str | None) -> dict[str, str]:
        """The names one expression uses: DynamoDB rejects unused ones."""
        return {self.mapping[a]: a for a in attributes if a is not None}
