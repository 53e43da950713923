"""Writer-side helpers around a transaction: tokens, counter values and optimistic rounds."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator, Mapping
from decimal import Context, Decimal
from typing import Any

from tally.core.dynamodb import Backoff, Cancelled, Names, deserialize
from tally.writers.errors import InvalidCounterError

# A revision takes ADD 1 while it stays within 38 digits.
REVISION_LIMIT = Decimal("9" * 37 + "8")
_WIDE = Context(prec=400)


def new_token() -> str:
    """A ``ClientRequestToken`` for one transaction body.

    Fresh per body, so a repeat of a request is a new request that reports what it did; shared
    by every resend of that body (botocore's retries after a lost response or
    ``TransactionInProgress``, and ours after a conflict), so a resend of a committed body is a
    replay, never a second write.
    """
    return str(uuid.uuid4())


def read_item(raw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An item as returned by DynamoDB (``{"N": ...}`` values), numbers exact and as DynamoDB
    holds them; None stays None.

    DynamoDB returns a number of 1E+38 or more in plain notation (1E+40 as 41 digits), which
    boto3 refuses to read, and its serializer refuses to send back (``decimal.Rounded``) in a
    fence or a delta. Read here, it is 1E+40 again: a writer can judge it by name and fence on it.
    """
    if not raw:
        return None
    return deserialize(raw)


def old_item(cancelled: Cancelled, index: int) -> dict[str, Any] | None:
    """The item whose condition failed, as it was (needs ALL_OLD on that item)."""
    return read_item(cancelled.reasons[index].get("Item"))


def number_or_none(
    item: Mapping[str, Any] | None,
    attribute: str,
    key: Mapping[str, str],
    *,
    limit: Decimal | None = None,
    scale: int | None = None,
    sequence: bool = False,
) -> Decimal | None:
    """The attribute as a Decimal (None when absent), judged: InvalidCounterError naming it
    when it is not a number, or a number a writer cannot build on: past ``±limit``, with more
    than ``scale`` decimal places, or (``sequence``) not a whole number of at least 0."""
    if item is None or attribute not in item:
        return None
    value = item[attribute]
    if not isinstance(value, Decimal) or not value.is_finite():
        raise InvalidCounterError(key, attribute, value)
    if sequence and value != value.to_integral_value():
        raise InvalidCounterError(key, attribute, value, f"holds {value}, not a whole number")
    if sequence and value < 0:
        raise InvalidCounterError(
            key, attribute, value, f"holds {value}: a sequence counter is never negative"
        )
    if limit is not None and value.copy_abs() > limit:
        raise InvalidCounterError(
            key, attribute, value, f"holds {value}, past ±{limit}, the most a writer adds to"
        )
    if scale is not None and value != value.quantize(Decimal(1).scaleb(-scale), context=_WIDE):
        raise InvalidCounterError(
            key, attribute, value, f"holds {value}, more decimal places than its scale {scale}"
        )
    return value


def revision_guard(names: Names, revision: str | None) -> tuple[list[str], dict[str, Any]]:
    """The condition that keeps ADD 1 on the revision exact (absent, or a number with room)."""
    if revision is None:
        return [], {}
    name = names[revision]
    condition = f"(attribute_not_exists({name}) OR {name} BETWEEN :revisionLow AND :revisionHigh)"
    bounds = {":revisionLow": REVISION_LIMIT.copy_negate(), ":revisionHigh": REVISION_LIMIT}
    return [condition], bounds


def retrying(backoff: Backoff) -> Iterator[int]:
    """Round numbers for an optimistic loop, with a sliver of jitter against lockstep."""
    for attempt in range(1, backoff.rounds + 1):
        if attempt > 1:
            time.sleep(random.uniform(0, backoff.base_seconds / 4))
        yield attempt
