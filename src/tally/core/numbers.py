"""Numbers as DynamoDB holds them: read exactly, summed exactly, judged against its domain.

DynamoDB stores a number of up to 38 significant digits, from 1E-130 to 9.99...E+125 in
magnitude (and 0), and its ``ADD`` is exact within that domain. Python's default decimal
context keeps 28 digits, so summing there can round: false drift, a missed one, or a repair
that writes a wrong total. Here every sum is exact whatever the order of its terms (the
working context holds every digit two in-domain numbers can spread over, and traps
``Inexact`` for anything else), and a result is checked against the domain where it is
stored or judged: ``fit`` turns a sum no counter can hold into ``Unrepresentable``.

``number`` classifies an attribute value as a foreign writer may have put it: a number in
the domain, or the name of what it is instead (``S``, ``B``, ``BOOL``, ``NULL``, ``L``,
``M``, a set, a number outside the domain), never its content.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import (
    Context,
    Decimal,
    DecimalException,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    Subnormal,
    Underflow,
)
from typing import Any

DIGITS = 38
EMIN, EMAX = -130, 125  # adjusted exponents: 1E-130 .. 9.99...E+125
ZERO = Decimal(0)
ONE = Decimal(1)

# DynamoDB's domain: a value this context takes without Inexact, Overflow or Subnormal is
# one DynamoDB can store. Rounded alone is no loss (trailing zeros of a long integer).
DYNAMODB = Context(
    prec=DIGITS,
    Emin=EMIN,
    Emax=EMAX,
    traps=[InvalidOperation, DivisionByZero, Overflow, Underflow, Subnormal, Inexact],
)
# The working context: exact for sums of in-domain numbers (their digits span at most
# 126 + 167 places; 1000 leaves room for any count of terms). Inexact is trapped, so an
# operand from outside the domain can never be rounded silently either.
EXACT = Context(
    prec=1000,
    Emin=-999_999,
    Emax=999_999,
    traps=[InvalidOperation, DivisionByZero, Overflow, Underflow, Inexact],
)
add = EXACT.add
subtract = EXACT.subtract


class _Null:
    """DynamoDB's NULL type held by an attribute, told apart from an absent attribute."""

    def __repr__(self) -> str:
        return "NULL"


NULL: Any = _Null()


class Unrepresentable(ArithmeticError):
    """A result DynamoDB cannot store: more than 38 digits, or outside its exponent range."""

    def __init__(self, value: Any):
        super().__init__(f"{value} needs more than {DIGITS} digits or lies outside 1E-130..1E+126")
        self.value = value


def exact_sum(values: Iterable[Decimal], start: Decimal = ZERO) -> Decimal:
    """The exact sum, in any order; may lie outside the domain (see ``fit``)."""
    total = start
    for value in values:
        total = add(total, value)
    return total


def fit(value: Decimal) -> Decimal:
    """``value`` as DynamoDB stores it (trailing zeros past 38 digits dropped);
    Unrepresentable when DynamoDB cannot hold it exactly."""
    if not value.is_finite():
        raise Unrepresentable(value)
    try:
        fitted = DYNAMODB.plus(value)
    except (DecimalException, ArithmeticError):
        raise Unrepresentable(value) from None
    return fitted.normalize(DYNAMODB) if len(value.as_tuple().digits) > DIGITS else value


def representable(value: Any) -> bool:
    """A finite Decimal DynamoDB can hold exactly."""
    if not isinstance(value, Decimal):
        return False
    try:
        fit(value)
    except Unrepresentable:
        return False
    return True


def number(value: Any) -> Decimal | str:
    """A deserialized attribute value as a number of the domain, or the name of its type."""
    if isinstance(value, Decimal):
        # Read by core.dynamodb's Deserializer: in the domain. Only one made elsewhere can be NaN.
        return value if value.is_finite() else "N (not finite)"
    return type_name(value)


def type_name(value: Any) -> str:
    """DynamoDB's name for a deserialized value's type (never the value itself)."""
    if value is None or value is NULL:
        return "NULL"
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, Decimal | int | float):
        return "N"
    if isinstance(value, str):
        return "S"
    if isinstance(value, bytes | bytearray) or isinstance(
        getattr(value, "value", None), bytes | bytearray
    ):
        return "B"  # bytes, or boto3's Binary wrapping them
    if isinstance(value, list):
        return "L"
    if isinstance(value, dict):
        return "M"
    if isinstance(value, set | frozenset):
        kinds = {type_name(v) for v in value}
        return f"{kinds.pop() if len(kinds) == 1 else ''}S"
    return type(value).__name__


def counter_problem(value: Any, *, whole: bool, name: str = "counter") -> str | None:
    """What is wrong with a counter's value, in words (None: a valid counter; absent is 0).

    ``whole``: a count or a sequence counter, a whole number >= 0.
    """
    if value is None:
        return None
    read = number(value)
    if isinstance(read, str):
        return f"{name} is not a number: {read}"
    if whole and read != read.to_integral_value():
        return f"{name} {read} is not an integer"
    if whole and read < 0:
        return f"{name} {read} is negative"
    return None


def parse(text: str) -> Decimal:
    """An ``N`` value's text as the Decimal DynamoDB holds; ValueError outside its domain."""
    try:
        value = DYNAMODB.create_decimal(text)
    except (DecimalException, ArithmeticError, TypeError):
        raise ValueError(f"not a DynamoDB number: {str(text)[:50]!r}") from None
    if not value.is_finite():
        raise ValueError(f"not a DynamoDB number: {text[:50]!r}")
    if len(text) > DIGITS and len(Decimal(text).as_tuple().digits) > DIGITS:
        return value.normalize(DYNAMODB)  # only an integer's trailing zeros were dropped
    return value


__all__ = [
    "DIGITS",
    "DYNAMODB",
    "EXACT",
    "ONE",
    "ZERO",
    "Unrepresentable",
    "add",
    "counter_problem",
    "exact_sum",
    "fit",
    "number",
    "parse",
    "representable",
    "subtract",
    "type_name",
]
