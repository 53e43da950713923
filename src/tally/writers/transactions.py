"""Writer-side helpers around a transaction: counter values and optimistic rounds."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from tally.dynamodb import Backoff
from tally.writers.errors import InvalidCounterError


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
