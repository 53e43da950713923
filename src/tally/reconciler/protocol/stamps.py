"""Children found through an index: the writers' stamps. A parent that never rests is judged
at a revision whose every change since a reference is proven, by its stamp, to have reached
the stream's window (docs/verification.md, "Parents that never rest")."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from decimal import Decimal
from typing import Any

# A writer's token: the second it was made (9 hex digits) and 60 random bits (15); a
# removal's is the removed child's token after "-". What the product's writers put on a
# parent for a removal of a child they did not stamp: matched by no note, so it is proven
# only once it lies before a look's reference.
TOKEN = re.compile(r"-?[0-9a-f]{24}")
SECOND_DIGITS = 9
UNKNOWN = "?"
# A stamp place no write has filled yet, as a reference shows it.
NONE_YET = "."


def removed(token: Any) -> str:
    """The token a parent takes when a child leaves it: the child's own, marked; unknown for
    a child no writer stamped."""
    return f"-{token}" if isinstance(token, str) and TOKEN.fullmatch(token) else UNKNOWN


def shown_by(child: Any, image_named_parent: bool, old: Any) -> tuple[str, ...]:
    """The tokens a child's record shows for one parent: its new token when its new image
    names the parent (it joined, or stays and changed), else its old token marked as
    removed; and the old token itself when its old image named the parent (the change the
    parent took before, still to be matched once this one replaced it in the window)."""
    tokens = []
    if image_named_parent:
        tokens.append(child)
    else:
        tokens.append(removed(old))
    tokens.append(old)
    return tuple(t for t in tokens if isinstance(t, str) and TOKEN.fullmatch(t))


def stamped_state(state: str, newest: Any) -> str:
    """A parent's state (``lifecycle.state_of``) with its newest stamp: a reference a look can
    later find in the parent's stamps."""
    if state == "gone":
        return state
    return f"{state} {newest if isinstance(newest, str) and newest else NONE_YET}"


def reference(state: str | None) -> tuple[int, str] | None:
    """The revision and newest stamp a stamped reference holds; None for any other."""
    parts = (state or "").split(" ")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return int(parts[1]), "" if parts[2] == NONE_YET else parts[2]


def revision_of(value: Any) -> int | None:
    """A revision as a whole number, None for anything else (absent, NULL, not whole)."""
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        return int(value)
    return None


def taken_since(
    since: tuple[int, str], revision: int, stamps: Sequence[str]
) -> tuple[str, ...] | None:
    """The stamps of the changes a parent at ``revision`` took after the reference ``since``
    (its revision and newest stamp), newest first; None unless each of those changes left
    one: the reference's newest stamp sits exactly as many places down as the parent took
    revisions since (none unstamped, none scrolled out of its ``stamps``)."""
    ref_revision, ref_newest = since
    taken = revision - ref_revision
    if taken < 0 or taken >= len(stamps) or stamps[taken] != ref_newest:
        return None
    return tuple(stamps[:taken])


def made_at(stamp: str) -> int | None:
    """The second a writer's token was made; None for anything else."""
    if not TOKEN.fullmatch(stamp):
        return None
    return int(stamp.lstrip("-")[:SECOND_DIGITS], 16)


def proven(
    since: tuple[int, str],
    revision: int,
    stamps: Sequence[str],
    tokens: Collection[str],
    *,
    newest_read: bool = False,
    young_since: float = 0,
) -> bool:
    """Every change a parent took after the reference ``since`` is one of the writers' and
    is known to the look: each stamp ``taken_since`` is among the ``tokens`` the window's
    notes hold, but the newest, when its child is read from the table (``newest_read``).
    So is every stamp the parent still holds from before the reference that was made since
    ``young_since``: a shard may lag more than a grace. Older ones, and changes no stamp
    tells of any more, are as old as a grace at least: the window holds them by then."""
    taken = taken_since(since, revision, stamps)
    if taken is None:
        return False
    if not all(stamp in tokens for stamp in (taken[1:] if newest_read else taken)):
        return False
    before = stamps[len(taken) :]
    return all(
        stamp in tokens
        for stamp in before
        if (made := made_at(stamp)) is not None and made >= young_since
    )


def tokens_of(notes: Iterable[Any]) -> frozenset[str]:
    """Every token the window's notes hold."""
    return frozenset(token for note in notes for token in note.tokens)
