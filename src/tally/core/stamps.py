"""The writers' stamps on children found through an index (a rule with ``through.stamp``): a
token per transaction, shared by the writers that make it and the reconciler that reads it
back from the stream (docs/verification.md, "Parents that never rest").

A token is 24 hex digits: the millisecond it was made (11), a mark of the child's key (6:
the first digits of its SHA-256) and 28 random bits (7). A parent a child leaves takes the
child's last token after ``-``; one a writer never stamped leaves ``?`` and a fresh token,
which no record shows."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

TOKEN = re.compile(r"-?[0-9a-f]{24}")
UNKNOWN = "?"
MILLISECOND_DIGITS, MARK_DIGITS, RANDOM_DIGITS = 11, 6, 7


def key_mark(child: Mapping[str, Any]) -> str:
    """The mark of a child's key a token carries: its canonical JSON's SHA-256, 6 digits."""
    text = json.dumps({k: str(v) for k, v in child.items()}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:MARK_DIGITS]


def is_token(value: Any) -> bool:
    return isinstance(value, str) and TOKEN.fullmatch(value) is not None


def removed(token: Any) -> str | None:
    """What a parent takes when a child leaves it: the child's token, marked; None for a
    child no writer stamped (the writer then leaves ``?`` and a fresh token: unique, and
    shown by no record)."""
    return f"-{token}" if is_token(token) and not token.startswith("-") else None


def made_at(token: str) -> float | None:
    """When a token was made, in epoch seconds (to the millisecond); None for anything that
    is no token."""
    return int(token.lstrip("-")[:MILLISECOND_DIGITS], 16) / 1000 if is_token(token) else None


def child_mark(token: str) -> str | None:
    """The mark of the child's key a token carries; None for anything that is no token."""
    return (
        token.lstrip("-")[MILLISECOND_DIGITS : MILLISECOND_DIGITS + MARK_DIGITS]
        if is_token(token)
        else None
    )
