"""Sequence rules: a counter that hands out numbers, and the members that hold them.

Members sit in the counter's item collection (``collection``), each in a partition of its
own keyed by the number (``partition``), are found through a GSI (``index``), or carry their
number in an attribute under a natural key (``attribute``: the reconciler keeps a ledger of
them from the stream).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from tally.rules.key_patterns import key_text
from tally.rules.rule_base import RuleBase
from tally.rules.table_keys import PK_SK, Key, KeyPattern, Strict, TableKeys


def _context_keys(info: ValidationInfo) -> TableKeys:
    found = (info.context or {}).get("table")
    return found if isinstance(found, TableKeys) else PK_SK


class _NumberedMembers(Strict):
    """Members whose key carries their number: prefix + number zero-padded to ``width``.

    The pattern is written as a field named after the key attribute (``SK = "ISSUE#*"``);
    it is gathered into ``key``.
    """

    key: dict[str, str]
    width: Annotated[int, Field(ge=1, le=38)] = 10

    @model_validator(mode="before")
    @classmethod
    def _gather_key_fields(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        keys = _context_keys(info)
        named = {name: data[name] for name in keys.names if name in data}
        if not named and "key" not in data:
            wanted = keys.sort_key if data.get("layout") == "collection" else keys.partition_key
            if wanted is None:
                raise ValueError("'collection' needs a table sort key; see layout 'partition'")
            others = sorted(set(data) - {"layout", "width"})
            raise ValueError(
                f'name the key attribute that carries the number: {wanted} = "PREFIX#*"'
                + (f" (not {', '.join(others)})" if others else "")
            )
        if not named:
            return data
        rest = {field: value for field, value in data.items() if field not in named}
        return rest | {"key": named}

    @property
    def attribute(self) -> str:
        """The key attribute that carries the number."""
        starred = [name for name, text in self.key.items() if text.endswith("*")]
        return starred[0] if starred else next(iter(self.key))

    @property
    def prefix(self) -> str:
        return self.key[self.attribute].removesuffix("*")


class CollectionMembers(_NumberedMembers):
    """Members in the counter's item collection: sort key = prefix + number."""

    layout: Literal["collection"]


class PartitionMembers(_NumberedMembers):
    """Members each in a partition of their own: partition key = prefix + number
    (orders numbered by an atomic counter, say)."""

    layout: Literal["partition"]


class IndexMembers(Strict):
    """Members keyed by a natural key, found through a sparse GSI (sequence, number)."""

    layout: Literal["index"]
    key: dict[str, str]
    index: Annotated[str, Field(min_length=1)]
    sequence_attribute: Annotated[str, Field(min_length=1)]
    number: Annotated[str, Field(min_length=1)]
    sequence: str | None = None


class AttributeMembers(Strict):
    """Members keyed by a natural key, their number in an attribute (users keyed by
    name, numbered by a gapless counter, say).

    No key or index leads from a number to its member: the reconciler keeps a ledger
    (number -> member key) in the audit table from the stream; the full audit rebuilds it.
    """

    layout: Literal["attribute"]
    key: dict[str, str]
    number: Annotated[str, Field(min_length=1)]


Members = CollectionMembers | PartitionMembers | IndexMembers | AttributeMembers
# What a sequence's counter holds: the last number handed out, the next free one, or no
# counter at all (members only: the highest member is the sequence's end).
CounterHolds = Literal["last", "next", "none"]
# The counter attribute of a members-only sequence: no item carries it.
NO_COUNTER = "-"


class SequenceRule(RuleBase):
    """The counter equals the highest number handed out; 1..counter each present once.

    ``counter_holds = "next"``: the counter is the next free number and numbering starts
    at 0, so member ``n`` is the sequence's (n+1)-th; internally every number is that
    ordinal (``ordinal``/``shown_number`` translate). ``"none"``: no counter item.
    """

    kind: Literal["sequence"]
    members: Annotated[Members, Field(discriminator="layout")]
    grace_seconds: Annotated[int, Field(ge=0, le=900)] = 60
    counter_holds: CounterHolds = "last"

    @model_validator(mode="before")
    @classmethod
    def _no_counter(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("counter_holds") != "none":
            return data
        if "counter" in data or "revision" in data:
            raise ValueError(
                "counter_holds = 'none' is a sequence without a counter: drop 'counter'"
            )
        return data | {"counter": NO_COUNTER}

    @property
    def has_counter(self) -> bool:
        return self.counter_holds != "none"

    def ordinal(self, number: int) -> int:
        """The position of a member's number in the sequence (1 = first)."""
        return number + 1 if self.counter_holds == "next" else number

    def shown_number(self, ordinal: int) -> int:
        """The member's own number for an ordinal: what findings show."""
        return ordinal - 1 if self.counter_holds == "next" else ordinal

    @property
    def sequence_name(self) -> str:
        """The GSI partition value naming this sequence (index layout)."""
        assert isinstance(self.members, IndexMembers)
        return self.members.sequence or self.name

    def member_pattern(self, keys: TableKeys) -> KeyPattern:
        members = self.members
        if isinstance(members, IndexMembers | AttributeMembers):
            return keys.patterns(members.key)
        pattern = keys.patterns({n: t for n, t in members.key.items() if n != members.attribute})
        number = members.attribute
        pattern[number] = keys.pattern(number, members.key[number], numbered=True)
        if isinstance(members, CollectionMembers):
            pattern[keys.partition_key] = self.parent_pattern(keys)[keys.partition_key]
        return pattern

    def member_key(self, counter_key: Mapping[str, str], number: int, keys: TableKeys) -> Key:
        """The key of the member at ordinal ``number`` (collection and partition layouts)."""
        members = self.members
        assert isinstance(members, CollectionMembers | PartitionMembers)
        attribute = members.attribute
        text = str(self.shown_number(number))
        if not keys.numeric(attribute):
            text = members.prefix + text.zfill(members.width)
        if isinstance(members, CollectionMembers):
            return {keys.partition_key: counter_key[keys.partition_key], attribute: text}
        return {name: p.value for name, p in keys.patterns(members.key).items()} | {attribute: text}

    def member_number(self, value: Any) -> int | None:
        """The ordinal a member's numbered key value carries, or None if it carries none."""
        members = self.members
        assert isinstance(members, CollectionMembers | PartitionMembers)
        text = key_text(value)
        if not isinstance(text, str) or not text.startswith(members.prefix):
            return None
        digits = text[len(members.prefix) :]
        return self.ordinal(int(digits)) if digits.isascii() and digits.isdigit() else None

    def attribute_number(self, value: Any) -> int | None:
        """The ordinal a member's number attribute carries, or None if it is no number."""
        if not isinstance(value, Decimal) or not value.is_finite() or value != int(value):
            return None
        ordinal = self.ordinal(int(value))
        return ordinal if ordinal > 0 else None
