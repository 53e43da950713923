"""Children found through an index: the writers' stamps (``tally.core.stamps``). A parent
that never rests is judged at a revision whose every change since a reference is proven,
by its stamp, to be known to the stream's window (docs/verification.md, "Parents that never
rest")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tally.core.numbers import subtract
from tally.core.stamps import UNKNOWN, child_mark, is_token, made_at, removed
from tally.reconciler.protocol import lifecycle
from tally.reconciler.protocol.window import Noted

# A stamp place no write has filled yet, as a reference shows it.
NONE_YET = "."


def shown_by(child: Any, image_named_parent: bool, old: Any) -> tuple[str, ...]:
    """The tokens a child's record shows for one parent: its new token when its new image
    names the parent (it joined, or stays and changed), else its old token marked as
    removed; and the old token itself when its old image named the parent (the change the
    parent took before, still to be matched once this one replaced it in the window)."""
    tokens = [child if image_named_parent else removed(old), old]
    return tuple(t for t in tokens if is_token(t))


@dataclass(frozen=True)
class Reference:
    """Where a parent stood when a batch or a look saw it: its revision, its newest stamp
    ("" where none yet), and its counter less what the writers' stamped changes added to
    it (``<stamp>Total``): what moved the counter behind the writers' backs."""

    revision: int
    newest: str
    offset: Decimal


def stamped_state(state: str, newest: Any, total: Any) -> str:
    """A parent's state (``lifecycle.state_of``) with its newest stamp and the writers' total:
    a reference a look can later find in the parent's stamps."""
    if state == "gone":
        return state
    shown = newest if isinstance(newest, str) and newest else NONE_YET
    return f"{state} {shown} {lifecycle.shown(total)}"


def reference(state: str | None) -> Reference | None:
    """The reference a stamped state holds; None for any other (gone, unstamped, a revision
    that is no whole number, a counter or total that is no number)."""
    parts = (state or "").split(" ")
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    try:
        counter, total = (Decimal(0 if p == "-" else p) for p in (parts[0], parts[3]))
        offset = subtract(counter, total)
    except ArithmeticError:
        return None
    if not offset.is_finite():
        return None
    return Reference(int(parts[1]), "" if parts[2] == NONE_YET else parts[2], offset)


def offset_of(counter: Any, total: Any) -> Decimal | None:
    """A parent's counter less the writers' total (absent: 0); None when either is no number."""
    values = [Decimal(0) if v is None else v for v in (counter, total)]
    if not all(isinstance(v, Decimal) and v.is_finite() for v in values):
        return None
    try:
        return subtract(values[0], values[1])
    except ArithmeticError:
        return None


def stamp_mark(stamp: Any) -> str | None:
    """The mark of the child's key a parent's stamp tells of: a token, a removal, or the
    fresh token of a child no writer had stamped (``?``); None for anything else."""
    if isinstance(stamp, str) and stamp.startswith(UNKNOWN):
        stamp = stamp[len(UNKNOWN) :]
    return child_mark(stamp)


def writers_parent_change(
    counters: tuple[Any, Any],
    totals: tuple[Any, Any],
    revisions: tuple[Any, Any],
    stamps: tuple[Sequence[Any], Sequence[Any]],
) -> bool:
    """A parent's record (old and new values) shows a stamped writer's own change: its
    counter moved by as much as the writers' total (the offset held), its revision by one,
    and its stamps shifted one place down under a new stamp no place held before. Such a
    change was one transaction with its child's: nothing to look at (absent values read as
    a writer finds them: 0, and ``""`` for an empty place)."""
    before, after = (offset_of(c, t) for c, t in zip(counters, totals, strict=True))
    if before is None or after is None or before != after:
        return False
    old_revision = 0 if revisions[0] is None else revision_of(revisions[0])
    new_revision = revision_of(revisions[1])
    if old_revision is None or new_revision != old_revision + 1:
        return False
    old, new = stamps
    if not new or len(old) != len(new) or not all(isinstance(s, str) for s in (*old, *new)):
        return False
    if stamp_mark(new[0]) is None or new[0] in old:
        return False
    return list(new[1:]) == list(old[:-1])


def expected_stamp(new: Any, old: Any, joins: bool) -> str | None:
    """The stamp a writer's change of a child leaves on a parent, as the child's record
    shows it: the child's new token when it joins the parent or stays and changes (a token
    it did not hold before), its old token marked when it leaves. None when no writer's
    change can show so: a token kept, none, or something that is no token."""
    if joins:
        fresh = is_token(new) and not new.startswith("-") and new != old
        return new if fresh else None
    return removed(old)


def attested(stamps: Sequence[Any], changes: Iterable[tuple[str, Sequence[str | None]]]) -> bool:
    """Every change of a child a batch showed under a parent (per child: the mark of its key
    and the stamps its records expect, ``expected_stamp``, in stream order) was a stamped
    writer's, with nothing since: the stamps of that child's mark the parent holds (read
    consistently after the records), newest first, begin with the expected ones, latest
    first. A writer stamps every parent a child's images name, so any later writer's change
    of the child would stand before them; a change no writer made shows no stamp and is
    looked at on its own record. Two children that share a mark: not attested."""
    marks: set[str] = set()
    for mark, expected in changes:
        if mark in marks or not expected or any(stamp is None for stamp in expected):
            return False
        marks.add(mark)
        held = [stamp for stamp in stamps if stamp_mark(stamp) == mark]
        if held[: len(expected)] != list(reversed(expected)):
            return False
    return True


def revision_of(value: Any) -> int | None:
    """A revision as a whole number, None for anything else (absent, NULL, not whole)."""
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        return int(value)
    return None


def taken_since(since: Reference, revision: int, stamps: Sequence[str]) -> tuple[str, ...] | None:
    """The stamps of the changes a parent at ``revision`` took after the reference ``since``,
    newest first; None unless each of those changes left one: the reference's newest stamp
    sits, once, exactly as many places down as the parent took revisions since (none
    unstamped, none scrolled out of its ``stamps``). With no stamp at the reference, the
    places below the changes since are the empty ones."""
    taken = revision - since.revision
    if taken < 0 or taken >= len(stamps) or stamps[taken] != since.newest:
        return None
    held = tuple(stamps[:taken])
    if since.newest == "":
        if not all(held) or any(stamps[taken:]):
            return None
    elif stamps.count(since.newest) != 1:
        return None
    return held


@dataclass(frozen=True)
class Known:
    """What the window's notes know of a parent's children: every token they hold, and per
    mark of a child's key, when the latest token its notes hold was made."""

    tokens: frozenset[str] = frozenset()
    latest: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, notes: Iterable[Noted]) -> Known:
        tokens: set[str] = set()
        latest: dict[str, float] = {}
        for note in notes:
            for token in note.tokens:
                tokens.add(token)
                mark, made = child_mark(token), made_at(token)
                if mark is not None and made is not None:
                    latest[mark] = max(made, latest.get(mark, made))
        return cls(frozenset(tokens), latest)

    def shown(self, stamp: str) -> bool:
        """The window holds the change that made ``stamp``."""
        return stamp in self.tokens

    def passed(self, stamp: str) -> bool:
        """The window holds that change, or a later change of the same child (one item's
        records come in order: the earlier one was verified first). Told by the mark of the
        child's key, which two children may share: trusted only before a reference."""
        mark, made = child_mark(stamp), made_at(stamp)
        later = mark is not None and made is not None and self.latest.get(mark, -1) > made
        return self.shown(stamp) or later


def proven(
    since: Reference,
    revision: int,
    offset: Decimal | None,
    stamps: Sequence[str],
    known: Known,
    *,
    newest_read: bool = False,
    young_since: float = 0,
) -> bool:
    """Every change a parent (now at ``revision``, its counter ``offset`` from the writers'
    total) took after the reference ``since`` is one of the writers' and is known to the
    look: nothing moved the counter behind the writers' backs since (the same offset), the
    window shows each stamp ``taken_since``, but the newest, when its child is read from the
    table (``newest_read``). And every stamp the parent still holds from before the
    reference that was made since ``young_since``, the window has passed: a shard may lag
    more than a grace. Older ones, and changes no stamp tells of any more, are as old as a
    grace at least: the window holds them by then."""
    taken = taken_since(since, revision, stamps)
    if taken is None or offset != since.offset:
        return False
    if not all(known.shown(stamp) for stamp in (taken[1:] if newest_read else taken)):
        return False
    return all(
        known.passed(stamp)
        for stamp in stamps[len(taken) :]
        if (made := made_at(stamp)) is not None and made >= young_since
    )
