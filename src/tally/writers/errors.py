"""Errors the writers raise; expected outcomes (duplicates, absent children) are values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tally.dynamodb import TransactionFailedError

__all__ = [
    "CounterBehindError",
    "InvalidCounterError",
    "ParentNotFoundError",
    "TransactionFailedError",
]


class ParentNotFoundError(LookupError):
    """The parent (or counter) item a write must bump does not exist."""

    def __init__(self, key: Mapping[str, str]):
        super().__init__(f"parent item {dict(key)} does not exist")
        self.key = dict(key)


class InvalidCounterError(ValueError):
    """A counter, revision or summed attribute holds something other than a number."""

    def __init__(self, key: Mapping[str, str], attribute: str, value: Any):
        kind = type(value).__name__
        super().__init__(f"attribute {attribute!r} of item {dict(key)} is not a number: {kind}")
        self.key = dict(key)
        self.attribute = attribute


class CounterBehindError(RuntimeError):
    """A number the counter was about to hand out is already taken by a member."""

    def __init__(self, key: Mapping[str, str], number: int):
        super().__init__(
            f"counter {dict(key)} is behind its members: number {number} already exists"
        )
        self.key = dict(key)
        self.number = number
