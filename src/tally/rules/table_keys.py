"""The table's key schema (a rules file's ``[table]`` section), and the strict model every
section of a rules file is read with.

Key values are text everywhere (numbers in DynamoDB's canonical form, see key_patterns);
``TableKeys.typed`` turns them back into what DynamoDB expects at the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tally.rules.key_patterns import KeyType, Pattern

Key = dict[str, str]
KeyPattern = dict[str, Pattern]


class Strict(BaseModel):
    """A section of a rules file: no unknown fields, immutable once read."""

    # Numbers written without quotes (sk = 0) are key values like any other.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


def key_names(partition_key: str, sort_key: str | None) -> tuple[str, ...]:
    """A table's or an index's key attributes: the partition key, then any sort key."""
    return (partition_key,) if sort_key is None else (partition_key, sort_key)


class TableKeys(Strict):
    """The table's key schema: a partition key and, optionally, a sort key; S or N each."""

    partition_key: Annotated[str, Field(min_length=1)]
    sort_key: Annotated[str, Field(min_length=1)] | None = None
    partition_key_type: KeyType = "S"
    sort_key_type: KeyType = "S"
    # The table's TTL attribute, if it has one: writers keep it off items an expiry would break.
    ttl_attribute: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> TableKeys:
        if self.sort_key == self.partition_key:
            raise ValueError("sort_key must differ from partition_key")
        if self.ttl_attribute is not None and self.ttl_attribute in self.names:
            raise ValueError("ttl_attribute must not be a key attribute")
        if self.sort_key is None and "sort_key_type" in self.model_fields_set:
            raise ValueError("sort_key_type is set but the table has no sort_key")
        return self

    @property
    def names(self) -> tuple[str, ...]:
        return key_names(self.partition_key, self.sort_key)

    def type_of(self, name: str) -> KeyType:
        return self.sort_key_type if name == self.sort_key else self.partition_key_type

    def numeric(self, name: str) -> bool:
        return name in self.names and self.type_of(name) == "N"

    def pattern(self, name: str, text: str, *, numbered: bool = False) -> Pattern:
        return Pattern.parse(text, numeric=self.numeric(name), numbered=numbered)

    def patterns(self, raw: Mapping[str, str]) -> KeyPattern:
        return {name: self.pattern(name, text) for name, text in raw.items()}

    def typed(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """The item with its number key attributes as Decimal, ready to serialize."""
        out = dict(item)
        for name in self.names:
            if self.type_of(name) == "N" and isinstance(out.get(name), str):
                out[name] = Decimal(out[name])
        return out


PK_SK = TableKeys(partition_key="PK", sort_key="SK")
