"""Errors the writers raise; expected outcomes (duplicates, absent children) are values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tally.core.dynamodb import TransactionFailedError
from tally.core.numbers import counter_problem, type_name

__all__ = [
    "CounterBehindError",
    "IdempotencyConflictError",
    "InvalidCounterError",
    "InvalidRequestError",
    "ParentHomedElsewhereError",
    "ParentNotFoundError",
    "TransactionFailedError",
]


class ParentNotFoundError(LookupError):
    """The parent (or counter) item a write must bump does not exist."""

    def __init__(self, key: Mapping[str, str]):
        super().__init__(f"parent item {dict(key)} does not exist")
        self.key = dict(key)


class ParentHomedElsewhereError(RuntimeError):
    """On a Global Table, the parent (or sequence counter) names another Region as its home
    (``tallyHome``): only writers there may change it. Nothing was written; send the write
    to ``home``."""

    def __init__(self, key: Mapping[str, Any], home: str, region: str):
        super().__init__(
            f"item {dict(key)} is homed in {home}: write it there (this writer writes in {region})"
        )
        self.key = dict(key)
        self.home = home
        self.region = region


class InvalidCounterError(ValueError):
    """A counter or revision a writer may not build on: not a number, or a number it cannot
    add to (fractional or negative where numbers are handed out, past the range it keeps);
    or a sum child's stored amount it may not take off or move (not a number, or outside
    its rule's amount domain). ``problem`` says which; a text value is never quoted (it may
    be personal)."""

    def __init__(self, key: Mapping[str, str], attribute: str, value: Any, problem: str = ""):
        # What is wrong, never the value unless it is a number (text may be personal data).
        problem = problem or (
            counter_problem(value, whole=True) or f"counter is not a number: {type_name(value)}"
        )
        super().__init__(f"attribute {attribute!r} of item {dict(key)}: {problem}")
        self.key = dict(key)
        self.attribute = attribute
        self.problem = problem


class CounterBehindError(RuntimeError):
    """A number the counter was about to hand out is already taken by a member."""

    def __init__(self, key: Mapping[str, str], number: int):
        super().__init__(
            f"counter {dict(key)} is behind its members: number {number} already exists"
        )
        self.key = dict(key)
        self.number = number


Field = tuple[str | int, ...]


class InvalidRequestError(ValueError):
    """A request a writer refuses before writing anything; ``field`` is the path to the culprit
    (``("attributes", "tags", 3)``), named as the HTTP API's body names it."""

    def __init__(self, field: Field, message: str):
        super().__init__(f"field {'.'.join(map(str, field))!r}: {message}")
        self.field = field
        self.reason = message


class IdempotencyConflictError(RuntimeError):
    """An idempotency key cannot answer this request.

    ``mismatch``: the key was used for a different request. ``superseded``: the key's request
    was handled, but what it wrote has since been undone or changed, so replaying its outcome
    would claim a write that is not there.
    """

    def __init__(self, key: str, reason: str, message: str):
        super().__init__(f"idempotency key {key!r}: {message}")
        self.key = key
        self.reason = reason
