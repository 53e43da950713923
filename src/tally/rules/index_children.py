"""A count or sum rule's ``through``: children in other item collections, found through a
global secondary index (docs/rules.md, "Children found through an index")."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from tally.rules.table_keys import Strict, key_names

# How long a child's write may take to reach an index before a recount trusts it.
INDEX_GRACE_SECONDS = 2
# How long a child's change the stream showed counts as the stream showed it, not as the
# index does: far longer than any lag an index is seen to have (docs/verification.md).
INDEX_WINDOW_SECONDS = 900


class IndexChildren(Strict):
    """Children in other item collections, found through a global secondary index.

    A child names its parent in the index's partition key attribute, whose value is the
    parent's partition key value (an inverted index: a follow edge ``PK = USER#<follower>``
    carries ``GSI1PK = USER#<followee>``). An item without it is no child (a sparse index);
    with ``sort_prefix``, only items whose index sort key begins with it are (a status such
    as ``FOLLOWING#``). The index is eventually consistent: ``grace_seconds`` is how long a
    write usually takes to show in it; for ``window_seconds`` after the stream showed a
    child change, the child counts as the stream showed it instead (docs/verification.md,
    "Children found through an index").
    """

    index: Annotated[str, Field(min_length=1)]
    partition_key: Annotated[str, Field(min_length=1)]
    sort_key: Annotated[str, Field(min_length=1)] | None = None
    sort_prefix: Annotated[str, Field(min_length=1)] | None = None
    grace_seconds: Annotated[int, Field(ge=1, le=900)] = INDEX_GRACE_SECONDS
    # None: INDEX_WINDOW_SECONDS, or ten graces when that is longer.
    window_seconds: Annotated[int, Field(ge=60, le=86_400)] | None = None
    # The product's writers stamp each change: a fresh token on the child (in this
    # attribute), and on the parent the last ``stamp_depth`` tokens, newest first, in
    # ``<stamp>0`` ... (docs/verification.md, "Parents that never rest"). None: no stamps.
    stamp: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    stamp_depth: Annotated[int, Field(ge=2, le=64)] = 16

    @model_validator(mode="after")
    def _consistent(self) -> IndexChildren:
        if self.window_seconds is not None and self.window_seconds <= 2 * self.grace_seconds:
            raise ValueError("window_seconds must be more than twice grace_seconds")
        if self.sort_prefix is not None and self.sort_key is None:
            raise ValueError("sort_prefix needs the index's sort_key")
        if self.sort_key == self.partition_key:
            raise ValueError("sort_key must differ from partition_key")
        if set(self.stamp_attributes) & set(self.attributes):
            raise ValueError("stamp's attributes must differ from the index's key attributes")
        return self

    @property
    def attributes(self) -> tuple[str, ...]:
        """The index's key attributes, as the children carry them."""
        return key_names(self.partition_key, self.sort_key)

    @property
    def window(self) -> int:
        """Seconds a child's change counts as the stream showed it, not as the index does."""
        if self.window_seconds is not None:
            return self.window_seconds
        return max(INDEX_WINDOW_SECONDS, 10 * self.grace_seconds)

    @property
    def stamps(self) -> tuple[str, ...]:
        """The parent's stamp attributes, newest first (none without ``stamp``)."""
        if self.stamp is None:
            return ()
        return tuple(f"{self.stamp}{place}" for place in range(self.stamp_depth))

    @property
    def stamp_child(self) -> str | None:
        """The parent's attribute naming the child of its newest stamp."""
        return None if self.stamp is None else f"{self.stamp}Child"

    @property
    def stamp_total(self) -> str | None:
        """The parent's attribute the writers add each stamped change's delta to."""
        return None if self.stamp is None else f"{self.stamp}Total"

    @property
    def stamp_attributes(self) -> tuple[str, ...]:
        """Every attribute the stamps take, on the child and on the parent."""
        if self.stamp is None:
            return ()
        assert self.stamp_child is not None and self.stamp_total is not None
        return (self.stamp, *self.stamps, self.stamp_child, self.stamp_total)
