"""Times as the project writes them: ISO 8601 in UTC, ``Z`` for the offset
(``2024-05-01T10:00:00.000Z``)."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(moment: datetime, timespec: str = "auto") -> str:
    """``moment`` in UTC; ``timespec`` as ``datetime.isoformat`` takes it."""
    return moment.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def epoch_iso(epoch: float, timespec: str = "auto") -> str:
    """Epoch seconds as ``iso`` writes them."""
    return iso(datetime.fromtimestamp(epoch, UTC), timespec)


def now_iso() -> str:
    """Now, to the millisecond."""
    return iso(datetime.now(UTC), "milliseconds")
