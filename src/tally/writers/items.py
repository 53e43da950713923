"""What DynamoDB accepts in an item, checked before the first write so a refusal names the field.

DynamoDB's limits: partition key values up to 2,048 bytes and sort key values up to 1,024
(UTF-8); attribute names 1..65,535 bytes; items up to 400 KB counted as names plus values;
lists and maps nested at most 32 levels (a top-level attribute and 31 containers); numbers
with at most 38 significant digits and a magnitude from 1E-130 (DynamoDB: under 1E+126, here
under 1E+38, see ``MAX_EXPONENT``); no empty sets; one transaction's items together under 4 MB.

Numbers are canonicalised (leading and trailing zeros trimmed, as DynamoDB stores them), so
a 40-digit integer that ends in zeros is stored rather than refused by boto3's serializer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import Binary

from tally.rules import TableKeys
from tally.writers.errors import Field, InvalidRequestError

MAX_ITEM_BYTES = 400 * 1024
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024
MAX_PARTITION_KEY_BYTES = 2048
MAX_SORT_KEY_BYTES = 1024
MAX_NAME_BYTES = 65535
MAX_CONTAINERS = 31  # nested lists/maps inside one top-level attribute: 32 levels in all
MAX_DIGITS = 38
# Of the leading digit. DynamoDB stores up to 9.9E+125, but returns numbers in plain notation
# (1E+40 as 41 digits), which boto3's deserializer refuses (boto/boto3#2500): a reader such as
# the reconciler could never read the item again. So magnitudes stop below 1E+38.
MIN_EXPONENT, MAX_EXPONENT = -130, 37
LARGEST = Decimal("9" * MAX_DIGITS)  # the largest number every reader can read back


def utf8_length(text: str, field: Field) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidRequestError(field, "is not valid Unicode (a lone surrogate)") from None


def binary(value: Any) -> bytes:
    """The bytes of a ``Binary``, ``bytes`` or ``bytearray`` (boto3's stubs mistype Binary)."""
    return bytes(value)


def check_key(key: Mapping[str, Any], table: TableKeys, field: Field) -> None:
    """Key values are non-empty strings within DynamoDB's key size limits."""
    for name, limit in ((table.partition_key, MAX_PARTITION_KEY_BYTES),) + (
        ((table.sort_key, MAX_SORT_KEY_BYTES),) if table.sort_key else ()
    ):
        value = key.get(name)
        if not isinstance(value, str) or not value:
            raise InvalidRequestError((*field, name), "must be a non-empty string")
        size = utf8_length(value, (*field, name))
        if size > limit:
            raise InvalidRequestError(
                (*field, name), f"is {size} bytes; DynamoDB allows at most {limit} in this key"
            )


def number(value: Any, field: Field) -> Decimal:
    """The value as DynamoDB stores it: a canonical Decimal; refused if DynamoDB cannot hold it."""
    if isinstance(value, float):
        raise InvalidRequestError(field, "floats lose digits: send a Decimal")
    if isinstance(value, bool) or not isinstance(value, Decimal | int):
        raise InvalidRequestError(field, f"must be a number, got {type(value).__name__}")
    decimal = Decimal(value)
    if not decimal.is_finite():
        raise InvalidRequestError(field, f"must be a finite number, got {decimal}")
    sign, digits, exponent = decimal.as_tuple()
    assert isinstance(exponent, int)
    end = len(digits)
    while end > 1 and digits[end - 1] == 0:
        end -= 1
    start = 0
    while start < end - 1 and digits[start] == 0:
        start += 1
    exponent += len(digits) - end
    significant = digits[start:end]
    if significant == (0,):
        return Decimal(0)
    if len(significant) > MAX_DIGITS:
        raise InvalidRequestError(
            field, f"has {len(significant)} significant digits; DynamoDB keeps at most 38"
        )
    canonical = Decimal((sign, significant, exponent))
    if not MIN_EXPONENT <= canonical.adjusted() <= MAX_EXPONENT:
        raise InvalidRequestError(
            field, f"{canonical} is outside the number range kept readable (1E-130 to under 1E+38)"
        )
    return canonical


def attributes(values: Mapping[str, Any], field: Field) -> dict[str, Any]:
    """Checked, canonical copies of top-level attributes (names and values)."""
    if not isinstance(values, Mapping):
        raise InvalidRequestError(field, f"must be an object, got {type(values).__name__}")
    return {_name(name, (*field, name)): _value(v, (*field, name), 0) for name, v in values.items()}


def _name(name: Any, field: Field) -> str:
    if not isinstance(name, str):
        raise InvalidRequestError(field, f"attribute names are strings, got {type(name).__name__}")
    size = utf8_length(name, field)
    if not 1 <= size <= MAX_NAME_BYTES:
        raise InvalidRequestError(
            field, f"attribute names are 1 to {MAX_NAME_BYTES} bytes, this one is {size}"
        )
    return name


def _value(value: Any, field: Field, containers: int) -> Any:
    if value is None or isinstance(value, bool | str | Binary):
        if isinstance(value, str):
            utf8_length(value, field)
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, Decimal | int | float):
        return number(value, field)
    if isinstance(value, Mapping | list | tuple):
        if containers == MAX_CONTAINERS:
            raise InvalidRequestError(field, "is nested deeper than DynamoDB's 32 levels")
        if isinstance(value, Mapping):
            return {
                _name(k, (*field, k)): _value(v, (*field, k), containers + 1)
                for k, v in value.items()
            }
        return [_value(v, (*field, i), containers + 1) for i, v in enumerate(value)]
    if isinstance(value, Set):
        return _set(value, field)
    raise InvalidRequestError(field, f"DynamoDB cannot store a {type(value).__name__}")


def _set(values: Set[Any], field: Field) -> set[Any]:
    kinds = {_set_kind(v) for v in values}
    if len(kinds) != 1 or None in kinds:
        raise InvalidRequestError(
            field, "a set must be non-empty and hold only strings, only numbers or only binaries"
        )
    return {_value(v, field, 0) for v in values}


def _set_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "S"
    if isinstance(value, Decimal | int) and not isinstance(value, bool):
        return "N"
    if isinstance(value, bytes | bytearray | Binary):
        return "B"
    return None


def item_size(item: Mapping[str, Any]) -> int:
    """Bytes DynamoDB counts against the 400 KB limit: each name plus its value."""
    return sum(len(name.encode()) + _size(value) for name, value in item.items())


def check_size(item: Mapping[str, Any], field: Field) -> int:
    size = item_size(item)
    if size > MAX_ITEM_BYTES:
        raise InvalidRequestError(
            field, f"the item would be {size} bytes; DynamoDB allows {MAX_ITEM_BYTES}"
        )
    return size


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, Binary):
        return len(binary(value))
    if isinstance(value, Decimal):
        return _number_size(value)
    if isinstance(value, Mapping):
        return 3 + sum(len(k.encode()) + _size(v) + 1 for k, v in value.items())
    if isinstance(value, Sequence):
        return 3 + sum(_size(v) + 1 for v in value)
    if isinstance(value, Set):
        return sum(_size(v) for v in value)
    return 1  # bool, null


def _number_size(value: Decimal) -> int:
    """One byte per pair of digits (pairs aligned on the decimal point), one for the exponent
    and one for a minus sign; zero is one byte."""
    if value == 0:
        return 1
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    high = exponent + len(digits) - 1
    low = exponent + len(digits) - len(bytes(digits).rstrip(b"\0"))
    return high // 2 - low // 2 + 2 + sign
