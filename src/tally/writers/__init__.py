"""Transactional writers: a child and its parent's counter change together, or not at all."""

from tally.writers.errors import (
    CounterBehindError,
    IdempotencyConflictError,
    InvalidCounterError,
    InvalidRequestError,
    ParentHomedElsewhereError,
    ParentNotFoundError,
    TransactionFailedError,
)
from tally.writers.sequences import Allocation, SequenceAllocator, Strategy
from tally.writers.tallies import TallyWriter, WriteResult

__all__ = [
    "Allocation",
    "CounterBehindError",
    "IdempotencyConflictError",
    "InvalidCounterError",
    "InvalidRequestError",
    "ParentHomedElsewhereError",
    "ParentNotFoundError",
    "SequenceAllocator",
    "Strategy",
    "TallyWriter",
    "TransactionFailedError",
    "WriteResult",
]
