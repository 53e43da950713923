"""Item collections at once: which of a batch's groups share an item collection, and so are
verified in order, by one worker (other collections run beside it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from tally.rules import Key


class Grouped(Protocol):
    @property
    def parent_key(self) -> Key: ...


G = TypeVar("G", bound=Grouped)


def item_collections(groups: Iterable[G], partition_key: str) -> list[list[G]]:
    """Groups by their parent's partition key, in the batch's order."""
    collections: dict[Any, list[G]] = {}
    for group in groups:
        collections.setdefault(group.parent_key[partition_key], []).append(group)
    return list(collections.values())
