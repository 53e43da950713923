"""The audit query's rows: one candidate each, whichever engine ran the query.

DuckDB hands over typed values; Athena's results arrive as CSV strings (NULL as an empty
field) through the state machine's Distributed Map. Both become the same ``Candidate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from tally.core.numbers import DYNAMODB
from tally.rules import Key, RuleSet

# What the query reports per candidate, besides the rule and the key.
PROBLEMS = (
    "drift",
    "orphans",
    "invalid_counter",
    "inexact",
    "counter_behind",
    "duplicates",
    "missing",
    "unindexed",  # the key is a child's, of a rule whose index cannot hold the item
)


@dataclass(frozen=True)
class Candidate:
    """One parent or counter whose exported numbers disagree; the recount decides."""

    rule: str
    key: Key
    stored: str | None  # the counter as exported; None when absent or not a number
    actual: str | None  # children counted or summed, or the highest member number
    problems: dict[str, int]  # the nonzero PROBLEMS
    first_missing: int | None = None

    @property
    def counter_seen(self) -> int:
        """The exported counter as a horizon for the sequence recheck (0: read it afresh)."""
        text = self.stored or ""
        return int(text) if text.isascii() and text.isdigit() else 0


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: str
    stored: str | None = None
    actual: str | None = None
    drift: int = 0
    orphans: int = 0
    invalid_counter: int = 0
    inexact: int = 0
    counter_behind: int = 0
    duplicates: int = 0
    missing: int = 0
    unindexed: int = 0
    first_missing: int | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_null(cls, value: Any) -> Any:
        # Athena's CSV results write NULL as an empty field.
        return None if value == "" else value

    @field_validator("stored", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return None if value is None else str(value)

    @field_validator("actual", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        # The engines print DECIMAL(38, 9) with all nine places: 3.000000000 is 3.
        # Runs before ``_empty_is_null``: Athena's NULL (an empty field) is None here too.
        if value is None or value == "":
            return None
        try:
            return f"{Decimal(str(value)).normalize(DYNAMODB):f}"  # 38 digits, not 28
        except ArithmeticError:
            raise ValueError(f"{value!r} is not a number") from None


def parse_candidate(row: Mapping[str, Any], rules: RuleSet) -> Candidate:
    """A query row (DuckDB's, or a line of Athena's CSV) as a Candidate; ValueError names the
    field when the row is malformed or names an unknown rule."""
    if not isinstance(row, Mapping):
        raise ValueError(f"bad candidate row: an object of columns is required, got {row!r}")
    names = rules.table.names
    key_fields = {f"key_{i}": name for i, name in enumerate(names)}
    missing = [field for field in key_fields if not row.get(field)]
    if missing:
        raise ValueError(f"bad candidate row: {', '.join(missing)}: a key value is required")
    rest = {k: v for k, v in row.items() if k not in key_fields}
    try:
        parsed = _Row.model_validate(rest)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}" for e in error.errors()
        )
        raise ValueError(f"bad candidate row: {problems}") from None
    try:
        rule = rules[parsed.rule]
    except KeyError as error:
        raise ValueError(f"bad candidate row: rule: {error.args[0]}") from None
    if parsed.unindexed and getattr(rule, "through", None) is None:
        raise ValueError(
            f"bad candidate row: unindexed: rule {parsed.rule!r} finds no children through an index"
        )
    values = parsed.model_dump()
    return Candidate(
        rule=parsed.rule,
        key={name: str(row[field]) for field, name in key_fields.items()},
        stored=parsed.stored,
        actual=parsed.actual,
        problems={name: values[name] for name in PROBLEMS if values[name]},
        first_missing=parsed.first_missing,
    )
