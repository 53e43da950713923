"""Key patterns: what a rule says about one key attribute, and the fast checks built from them.

A string attribute's pattern is an exact value, a prefix (``"POST#*"``), or, for sequence
members, a numbered prefix: the prefix followed by a whole number in ASCII digits. A number
attribute's pattern is an exact number (``"0"``) or ``"*"``: any positive number (children),
any positive whole number (members). Key values are handled as text throughout, numbers in
DynamoDB's own canonical form (``"1.5"``, ``"100"``), so keys from the stream, from reads and
from the rules compare as plain strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

KeyType = Literal["S", "N"]

# Check modes, compiled into plain tuples for the classification hot path.
EXACT, PREFIX, NUMBERED, POSITIVE, POSITIVE_WHOLE = range(5)
Check = tuple[str, str, int]
Checks = tuple[Check, ...]


def number_text(value: Decimal) -> str:
    """A number as DynamoDB writes it back: no exponent, no trailing zeros (1.50 -> 1.5)."""
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def key_text(value: Any) -> Any:
    """A key value as text: strings as they are, numbers (Decimal) in canonical form."""
    return number_text(value) if isinstance(value, Decimal) else value


def parse_number(text: str) -> Decimal:
    """The finite number ``text`` holds; ValueError otherwise."""
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a number") from None
    if not number.is_finite():
        raise ValueError(f"{text!r} is not a finite number")
    return number


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _positive_whole(text: str) -> bool:
    return _digits(text) and text[0] != "0"


def _positive(text: str) -> bool:
    return not text.startswith("-") and text != "0"


@dataclass(frozen=True)
class Pattern:
    """One key attribute's pattern (see the module docstring)."""

    value: str
    is_prefix: bool
    numbered: bool = False
    numeric: bool = False

    @classmethod
    def parse(cls, text: str, *, numeric: bool = False, numbered: bool = False) -> Pattern:
        if "*" in text[:-1]:
            raise ValueError(f"{text!r} can never match: '*' may only end a pattern")
        if numeric:
            if text == "*":
                return cls("", True, numbered, True)
            if text.endswith("*"):
                raise ValueError(f"{text!r}: a number key has no prefixes; use a number or '*'")
            return cls(number_text(parse_number(text)), False, numbered, True)
        if text.endswith("*"):
            return cls(text[:-1], True, numbered)
        if not text:
            raise ValueError("an empty key value can never match: DynamoDB keys are non-empty")
        return cls(text, False, numbered)

    @property
    def mode(self) -> int:
        if not self.is_prefix:
            return EXACT
        if self.numeric:
            return POSITIVE_WHOLE if self.numbered else POSITIVE
        return NUMBERED if self.numbered else PREFIX

    def check(self, name: str) -> Check:
        return (name, self.value, self.mode)

    def matches(self, value: str) -> bool:
        return check_passes(self.value, self.mode, value)

    def overlaps(self, other: Pattern) -> bool:
        """True when some value matches both."""
        if not self.is_prefix:
            return other.matches(self.value)
        if not other.is_prefix:
            return self.matches(other.value)
        if self.numeric or other.numeric:
            return True  # both admit, at least, every positive whole number
        shorter, longer = sorted((self, other), key=lambda p: len(p.value))
        if not longer.value.startswith(shorter.value):
            return False
        # A numbered prefix continues with digits only: the longer prefix must too.
        rest = longer.value[len(shorter.value) :]
        return not shorter.numbered or _digits(rest) or not rest

    def __str__(self) -> str:
        return self.value + "*" if self.is_prefix else self.value


def check_passes(value: str, mode: int, actual: str) -> bool:
    if mode == EXACT:
        return actual == value
    if mode == PREFIX:
        return actual.startswith(value)
    if mode == NUMBERED:
        return actual.startswith(value) and _digits(actual[len(value) :])
    if mode == POSITIVE_WHOLE:
        return _positive_whole(actual)
    return _positive(actual)


def checks_pass(checks: Checks, key: Mapping[str, Any]) -> bool:
    """Whether ``key`` passes every check; runs once per rule per stream record."""
    for name, value, mode in checks:
        actual = key.get(name)
        if actual.__class__ is not str:
            if actual.__class__ is not Decimal:
                return False
            actual = number_text(actual)
        # Literal modes (PREFIX, EXACT): no global lookup per check on the hot path.
        if mode == 1:
            if not actual.startswith(value):
                return False
        elif mode == 0:
            if actual != value:
                return False
        elif not check_passes(value, mode, actual):
            return False
    return True
