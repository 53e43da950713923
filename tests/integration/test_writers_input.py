"""Bad input to the writers on DynamoDB Local: refused by field, before anything is written."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tally.rules import load_rules, parse_rules
from tally.writers import (
    InvalidCounterError,
    InvalidRequestError,
    SequenceAllocator,
    TallyWriter,
    WriteResult,
)
from tally.writers import items as limits
from tests.harness.tables import throwaway_table
from tests.integration.conftest import RULES_FILE
from tests.integration.test_writers import get, put
from tests.utils import serialize

RULES = load_rules()
POST = {"PK": "POST#a91f", "SK": "META"}
LIKE = {"PK": "POST#a91f", "SK": "LIKE#USER#7c20"}
ORDER = {"PK": "ORDER#17", "SK": "META"}
LINE = {"PK": "ORDER#17", "SK": "LINE#3"}
PROJECT = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
USERS = {"PK": "UserMetadata", "SK": "META"}


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture(scope="module")
def shared(dynamodb: Any, template: dict[str, Any]) -> Iterator[str]:
    """One table for the module: refused writes leave it as it was, so tests can share it."""
    with throwaway_table(dynamodb, template) as name:
        put(dynamodb, name, {**POST, "likeTally": 0})
        put(dynamodb, name, {**ORDER, "total": Decimal("9E+37")})
        yield name


@pytest.fixture
def table_name(shared: str) -> str:
    return shared


@pytest.fixture
def seeded(dynamodb: Any, shared: str) -> Callable[[], list[Any]]:
    """A reader of the whole table, to prove that nothing was written."""

    def scan() -> list[Any]:
        items = dynamodb.scan(TableName=shared, ConsistentRead=True)["Items"]
        return sorted(items, key=lambda item: (item["PK"]["S"], item["SK"]["S"]))

    return scan


BAD_CHILDREN: dict[str, tuple[Callable[[TallyWriter], Any], tuple[Any, ...]]] = {
    "partition key over 2048 bytes": (
        lambda w: w.add_child({"PK": "POST#" + "é" * 1022, "SK": "LIKE#1"}),
        ("key", "PK"),
    ),
    "sort key over 1024 bytes": (
        lambda w: w.add_child({**POST, "SK": "LIKE#" + "x" * 1020}),
        ("key", "SK"),
    ),
    "lone surrogate in a key": (
        lambda w: w.add_child({**POST, "SK": "LIKE#\ud800"}),
        ("key", "SK"),
    ),
    "empty attribute name": (lambda w: w.add_child(LIKE, {"": 1}), ("attributes", "")),
    "empty nested name": (lambda w: w.add_child(LIKE, {"m": {"": 1}}), ("attributes", "m", "")),
    "attribute name over 64 KB": (
        lambda w: w.add_child(LIKE, {"n" * 65536: 1}),
        ("attributes", "n" * 65536),
    ),
    "32 nested lists": (
        lambda w: w.add_child(LIKE, {"deep": nested(32)}),
        ("attributes", "deep", *[0] * 31),
    ),
    "NaN": (lambda w: w.add_child(LIKE, {"x": Decimal("NaN")}), ("attributes", "x")),
    "Infinity": (lambda w: w.add_child(LIKE, {"x": Decimal("-Infinity")}), ("attributes", "x")),
    "1E+400": (lambda w: w.add_child(LIKE, {"x": Decimal("1E+400")}), ("attributes", "x")),
    "1E-131": (lambda w: w.add_child(LIKE, {"x": Decimal("1E-131")}), ("attributes", "x")),
    "1E+38, which readers could not read back": (
        lambda w: w.add_child(LIKE, {"x": 10**38}),
        ("attributes", "x"),
    ),
    "39 digits": (lambda w: w.add_child(LIKE, {"x": 10**38 + 1}), ("attributes", "x")),
    "a float": (lambda w: w.add_child(LIKE, {"x": [0.1]}), ("attributes", "x", 0)),
    "an empty set": (lambda w: w.add_child(LIKE, {"s": set()}), ("attributes", "s")),
    "a mixed set": (lambda w: w.add_child(LIKE, {"s": {"a", 1}}), ("attributes", "s")),
    "a set of floats": (lambda w: w.add_child(LIKE, {"s": {0.5}}), ("attributes", "s")),
    "a datetime": (
        lambda w: w.add_child(LIKE, {"at": datetime.datetime(2025, 1, 1)}),
        ("attributes", "at"),
    ),
    "an item over 400 KB": (lambda w: w.add_child(LIKE, {"x": "a" * 409_600}), ("attributes",)),
    "the rule's counter": (
        lambda w: w.add_child(LIKE, {"likeTally": 5}),
        ("attributes", "likeTally"),
    ),
    "the rule's revision": (
        lambda w: w.add_child(LIKE, {"tallyRevision": 1}),
        ("attributes", "tallyRevision"),
    ),
    "the repair marker": (
        lambda w: w.add_child(LIKE, {"tallyRepair": "x"}),
        ("attributes", "tallyRepair"),
    ),
    "a sequence index attribute": (
        lambda w: w.add_child(LIKE, {"seqName": "user-numbers"}),
        ("attributes", "seqName"),
    ),
    "a sequence number attribute": (
        lambda w: w.add_child(LIKE, {"NumIdentifier": 3}),
        ("attributes", "NumIdentifier"),
    ),
    "the TTL attribute on a child whose expiry would drift": (
        lambda w: w.add_child(LIKE, {"expiresAt": 1_900_000_000}),
        ("attributes", "expiresAt"),
    ),
    "a key attribute among the attributes": (
        lambda w: w.add_child(LIKE, {"SK": "LIKE#other"}),
        ("attributes", "SK"),
    ),
    "a sum child without its amount": (lambda w: w.add_child(LINE), ("attributes", "amount")),
    "an amount that is a string": (
        lambda w: w.add_child(LINE, {"amount": "12.5"}),
        ("attributes", "amount"),
    ),
    "an amount that is a bool": (
        lambda w: w.add_child(LINE, {"amount": True}),
        ("attributes", "amount"),
    ),
    "a total past the readable range": (
        lambda w: w.add_child(LINE, {"amount": Decimal("9E+37")}),
        ("attributes", "amount"),
    ),
    "a total past 38 digits": (
        lambda w: w.add_child(LINE, {"amount": Decimal("1E-100")}),
        ("attributes", "amount"),
    ),
    "a new amount of 1E+400": (lambda w: w.change_amount(LINE, Decimal("1E+400")), ("amount",)),
    "an amount on a count child": (lambda w: w.change_amount(LIKE, 3), ("amount",)),
    "a key no rule counts": (lambda w: w.add_child({**POST, "SK": "COMMENT#1"}), ("key",)),
    "a key missing its sort key": (lambda w: w.remove_child({"PK": "POST#a91f"}), ("key",)),
    "an idempotency key over 255 characters": (
        lambda w: w.add_child(LIKE, idempotency_key="k" * 256),
        ("idempotency_key",),
    ),
}


@pytest.mark.parametrize("case", BAD_CHILDREN)
def test_a_bad_child_write_is_refused_by_field_and_writes_nothing(
    case: str, dynamodb: Any, table_name: str, seeded: Callable[[], list[Any]]
) -> None:
    call, field = BAD_CHILDREN[case]
    before = seeded()
    with pytest.raises(InvalidRequestError) as raised:
        call(TallyWriter(dynamodb, table_name, RULES))
    assert raised.value.field == field
    assert seeded() == before


def test_what_dynamodb_accepts_at_its_limits_is_written(dynamodb, table_name) -> None:
    writer = TallyWriter(dynamodb, table_name, RULES)
    values = {
        "deep": nested(31),
        "big": 5 * 10**37,  # 38 digits, one of them significant
        "tiny": Decimal("1E-130"),
        "huge": Decimal("-" + "9" * 38),
        "negative zero": Decimal("-0.000"),
        "s": {Decimal("1"), Decimal("2.50")},
        "n" * 65535: "",
    }
    like = {"PK": "POST#limits", "SK": "LIKE#1"}
    put(dynamodb, table_name, {"PK": "POST#limits", "SK": "META", "likeTally": 0})
    assert writer.add_child(like, values) == WriteResult("created")
    stored = get(dynamodb, table_name, like["PK"], like["SK"])
    assert stored is not None
    assert stored["big"] == Decimal("5E+37") and stored["tiny"] == Decimal("1E-130")
    longest = {"PK": "POST#" + "a" * 2043, "SK": "LIKE#" + "b" * 1019}
    put(dynamodb, table_name, {"PK": longest["PK"], "SK": "META", "likeTally": 0})
    assert writer.add_child(longest) == WriteResult("created")


def test_a_child_may_carry_the_ttl_attribute_when_its_rule_counts_expiries(dynamodb, table_name):
    rules = load_rules(RULES_FILE)  # its "sessions" rule counts a TTL expiry as a removal
    put(dynamodb, table_name, {"PK": "USER#1", "SK": "META", "activeSessions": 0})
    writer = TallyWriter(dynamodb, table_name, rules)
    session = {"PK": "USER#1", "SK": "SESSION#a"}
    assert writer.add_child(session, {"expiresAt": 1_900_000_000}).outcome == "created"
    with pytest.raises(InvalidRequestError) as raised:
        writer.add_child({"PK": "POST#1", "SK": "LIKE#1"}, {"expiresAt": 1_900_000_000})
    assert raised.value.field == ("attributes", "expiresAt")


def test_a_change_whose_difference_needs_more_than_38_digits_is_refused(
    dynamodb, table_name, seeded
) -> None:
    line = {"PK": "ORDER#diff", "SK": "LINE#1"}
    put(dynamodb, table_name, {"PK": "ORDER#diff", "SK": "META", "total": Decimal("1E+37")})
    put(dynamodb, table_name, {**line, "amount": Decimal("1E+37")})
    before = seeded()
    with pytest.raises(InvalidRequestError) as raised:
        TallyWriter(dynamodb, table_name, RULES).change_amount(line, Decimal("1E-100"))
    assert raised.value.field == ("amount",)
    assert seeded() == before


@pytest.mark.parametrize("amount", ["1E+40", "-1E+40", "9" * 38, "1E-100", "1.23456789E+125"])
@pytest.mark.parametrize("operation", ["remove", "change"])
def test_a_line_whose_stored_amount_no_writer_stores_is_refused_naming_it(
    dynamodb, table_name, seeded, operation, amount
) -> None:
    """``TallyWriter`` itself, not only the HTTP API: InvalidCounterError on the amount."""
    line = {"PK": "ORDER#foreign", "SK": "LINE#1"}
    put(dynamodb, table_name, {"PK": "ORDER#foreign", "SK": "META", "total": Decimal(0)})
    put(dynamodb, table_name, {**line, "amount": Decimal(amount)})
    before = seeded()
    writer = TallyWriter(dynamodb, table_name, RULES)
    with pytest.raises(InvalidCounterError) as refused:
        if operation == "remove":
            writer.remove_child(line)
        else:
            writer.change_amount(line, 5)
    assert (refused.value.attribute, refused.value.key) == ("amount", line)
    assert seeded() == before


# A rule whose amounts span 32 digits: Python's default context (28 digits) would round them.
WIDE = parse_rules(
    {
        "rules": [
            {
                "name": "ledger",
                "kind": "sum",
                "parent": {"PK": "LEDGER#*", "SK": "META"},
                "children": {"SK": "ENTRY#*"},
                "counter": "balance",
                "summed": "amount",
                "scale": 2,
                "max_amount": "1E+30",
            }
        ]
    }
)


def test_an_amount_of_32_digits_is_taken_off_exactly(dynamodb, table_name) -> None:
    """Negated as ``-amount`` in Python's 28-digit context, the removal would subtract
    1.234567890123456789012345679E+29 and leave a total of -9.88 behind."""
    ledger, entry = {"PK": "LEDGER#wide", "SK": "META"}, {"PK": "LEDGER#wide", "SK": "ENTRY#1"}
    put(dynamodb, table_name, {**ledger, "balance": Decimal(0)})
    writer = TallyWriter(dynamodb, table_name, WIDE)
    amount = Decimal("123456789012345678901234567890.12")
    assert writer.add_child(entry, {"amount": amount}).outcome == "created"
    assert (get(dynamodb, table_name, ledger["PK"], "META") or {})["balance"] == amount
    assert writer.remove_child(entry).outcome == "removed"
    assert (get(dynamodb, table_name, ledger["PK"], "META") or {})["balance"] == 0


# --- allocations --------------------------------------------------------------------------

BAD_ALLOCATIONS: dict[str, tuple[dict[str, Any], tuple[Any, ...]]] = {
    "a member over 400 KB (atomic)": (
        {"strategy": "atomic", "attributes": {"body": "x" * 409_600}},
        ("attributes",),
    ),
    "a member over 400 KB (gapless)": ({"attributes": {"body": "x" * 409_600}}, ("attributes",)),
    "a block over 4 MB": (
        {"strategy": "block", "count": 98, "attributes": {"body": "x" * 45_000}},
        ("count",),
    ),
    "the counter attribute": ({"attributes": {"lastIssue": 9}}, ("attributes", "lastIssue")),
    "a sequence index attribute": ({"attributes": {"seqName": "x"}}, ("attributes", "seqName")),
    "the TTL attribute": ({"attributes": {"expiresAt": 1}}, ("attributes", "expiresAt")),
    "the repair marker": ({"attributes": {"tallyRepair": 1}}, ("attributes", "tallyRepair")),
    "a key attribute": ({"attributes": {"SK": "ISSUE#7"}}, ("attributes", "SK")),
    "an unknown strategy": ({"strategy": "fast"}, ("strategy",)),
    "a count for gapless": ({"count": 2}, ("count",)),
    "a block of 99": ({"strategy": "block", "count": 99}, ("count",)),
    "a member key for a collection": ({"member_key": {"PK": "x", "SK": "y"}}, ("member_key",)),
}


@pytest.mark.parametrize("case", BAD_ALLOCATIONS)
def test_a_bad_allocation_is_refused_before_the_counter_moves(
    case: str, dynamodb: Any, table_name: str, seeded: Callable[[], list[Any]]
) -> None:
    request, field = BAD_ALLOCATIONS[case]
    before = seeded()
    with pytest.raises(InvalidRequestError) as raised:
        SequenceAllocator(dynamodb, table_name, RULES).allocate(PROJECT, **request)
    assert raised.value.field == field
    assert seeded() == before


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"member_key": {"PK": "User#" + "x" * 2044, "SK": "PROFILE"}}, ("member_key", "PK")),
        ({"member_key": {"PK": "Team#1", "SK": "PROFILE"}}, ("member_key",)),
        ({"member_key": {"PK": "User#1"}}, ("member_key",)),
        ({"member_key": {"PK": "User#1", "SK": "P"}, "strategy": "sortkey"}, ("strategy",)),
        ({"member_key": {"PK": "User#1", "SK": "P"}, "attributes": {"NumIdentifier": 1}}, None),
    ],
)
def test_a_bad_natural_key_registration_is_refused(
    dynamodb, table_name, seeded, request_, field
) -> None:
    before = seeded()
    with pytest.raises(InvalidRequestError) as raised:
        SequenceAllocator(dynamodb, table_name, RULES).allocate(USERS, **request_)
    assert raised.value.field == (field or ("attributes", "NumIdentifier"))
    assert seeded() == before


def test_an_unknown_counter_is_refused_naming_the_counter(dynamodb, table_name) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        SequenceAllocator(dynamodb, table_name, RULES).allocate({"PK": "X", "SK": "Y"})
    assert raised.value.field == ("counter",)


# --- the size estimate against the engine -------------------------------------------------

SHAPES = {
    "string": {},
    "numbers": {"n": [Decimal("-123.45"), Decimal("1E+30"), 10**37, Decimal("0.001"), 0]},
    "nested": {"m": {"a": [True, None, {"b": "é"}], "": []} | {"c": {}}},
    "sets": {"ss": {"a", "bb"}, "ns": {Decimal("1.5"), 22}, "bs": {b"\x00\x01"}},
    "binary": {"b": b"\x00" * 100},
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_size_estimate_matches_dynamodb_at_400_kb(dynamodb, table_name, shape) -> None:
    values = {k: v for k, v in SHAPES[shape].items()}
    values.get("m", {}).pop("", None)  # DynamoDB refuses empty names; kept out of the probe
    base = {"PK": "SIZE", "SK": shape, **limits.attributes(values, ("attributes",))}
    filler = limits.MAX_ITEM_BYTES - limits.item_size({**base, "f": ""})
    exact = {**base, "f": "x" * filler}
    over = {**base, "f": "x" * (filler + 1)}
    assert limits.item_size(exact) == limits.MAX_ITEM_BYTES
    dynamodb.put_item(TableName=table_name, Item=serialize(exact))
    with pytest.raises(InvalidRequestError):
        limits.check_size(over, ("attributes",))
    with pytest.raises(ClientError, match="size"):
        dynamodb.put_item(TableName=table_name, Item=serialize(over))
