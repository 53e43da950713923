"""Writer-side helpers around a transaction: tokens, counter values and optimistic rounds."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from tally.dynamodb import Backoff
from tally.writers.errors import InvalidCounterError


def new_token() -> str:
    """A ``ClientRequestToken`` for one transaction body.

    Fresh per body, so a repeat of a request is a new request that reports what it did; shared
    by every resend of that body (botocore's retries after a lost response, and ours after
    ``TransactionInProgress``), so a resend of a committed body is a replay, never a second write.
    """
    return str(uuid.uuid4())


def number_or_none(item: Mapping[str, Any] | None, attribute: str, key: Mapping[str, str]) -> Any:
    """The attribute as a Decimal (None when absent); InvalidCounterError for any other type."""
    if item is None or attribute not in item:
        return None
    value = item[attribute]
    if not isinstance(value, Decimal):
        raise InvalidCounterError(key, attribute, value)
    return value


def retrying(backoff: Backoff) -> Iterator[int]:
    """Round numbers for an optimistic loop, with a sliver of jitter against lockstep."""
    for attempt in range(1, backoff.rounds + 1):
        if attempt > 1:
            time.sleep(random.uniform(0, backoff.base_seconds / 4))
        yield attempt
