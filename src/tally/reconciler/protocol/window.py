"""Children found through an index: the stream's window. What the stream showed of a child
lately is what a look counts, not what a lagging index shows of it (docs/verification.md,
"Children found through an index")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from tally.rules import Key

KeyId = tuple[tuple[str, str], ...]


def key_id(key: Key) -> KeyId:
    """A key as a hashable, order-free identity (of a parent, a group, a noted child)."""
    return tuple(sorted(key.items()))


@dataclass(frozen=True)
class Noted:
    """A child the stream showed changing under a parent: by the record with
    ``sequence_number``, after which its image named the parent (``counted``) or not, with
    ``amount`` (a sum's; None for a count). ``counted`` None: the record held an amount no
    writer could store, so only the table can say."""

    key: Key
    sequence_number: str
    counted: bool | None
    amount: Decimal | None = None
    # When it was noted (epoch seconds; 0: not read back from the window yet).
    at: float = field(default=0.0, compare=False)
    # The writers' tokens its records showed for the parent (protocol.stamps.shown_by).
    tokens: tuple[str, ...] = field(default=(), compare=False)


def latest(notes: Iterable[Noted]) -> dict[KeyId, Noted]:
    """Per child, the note of its latest record (one item's records are in order on its
    shard, so their sequence numbers compare as numbers), with every token they showed."""
    found: dict[KeyId, Noted] = {}
    for note in notes:
        seen = found.get(key_id(note.key))
        if seen is not None:
            tokens = tuple(dict.fromkeys((*seen.tokens, *note.tokens)))
            if int(note.sequence_number) < int(seen.sequence_number):
                note = seen
            note = replace(note, tokens=tokens)
        found[key_id(note.key)] = note
    return found


def split(hits: Mapping[KeyId, Any], noted: Mapping[KeyId, Noted]) -> tuple[list[Any], list[Noted]]:
    """What a look counts: the index's hits for the children the stream did not show lately
    (their entries are older than the window: the index has them as they are), and the
    noted children, whatever the index shows of them (it may not show them yet, or show
    them as they were)."""
    return [hit for id_, hit in hits.items() if id_ not in noted], list(noted.values())


def index_behind(
    shown: Mapping[KeyId, Decimal | None], noted: Mapping[KeyId, Noted], now: float
) -> float:
    """At least how far behind the stream the index is, in seconds: the age of the oldest
    noted change it does not show yet (a child noted as counted that it does not list, or
    lists with another amount; one noted as not counted that it still lists); 0 when it
    shows every noted change. ``shown``: the index's hits, with the amount each shows (None:
    a count's)."""
    ages = [
        now - note.at
        for id_, note in noted.items()
        if note.counted is not None
        and note.at
        and (
            (id_ in shown) != note.counted
            or (note.counted and note.amount is not None and shown[id_] != note.amount)
        )
    ]
    return max([0.0, *ages])
