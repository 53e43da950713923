"""Numbers across DynamoDB's whole domain: the exact context, and the product's decisions on
values drawn from all of it (1-38 digits, exponents -130..125, and every attribute type a
foreign writer can put) against a reference that sums in plain integers."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.audit.scan import _disagrees, _tally
from tally.audit.sql import AuditQuery
from tally.core.dynamodb import Deserializer, deserialize, serialize
from tally.core.numbers import (
    DYNAMODB,
    Unrepresentable,
    counter_problem,
    exact_sum,
    fit,
    number,
    parse,
    representable,
    type_name,
)
from tally.local.audit_duckdb import candidates
from tally.local.exports import read_export
from tally.reconciler.protocol.carry import Carry
from tally.reconciler.repair.policy import RepairPolicy
from tally.reconciler.report.rechecks import Recheck
from tally.reconciler.report.scheduling import Settle
from tally.reconciler.stream.grouping import group_records
from tally.reconciler.table.tally_table import TallyTable
from tally.reconciler.verification import Reconciler
from tally.rules import load_rules
from tally.writers.errors import InvalidCounterError
from tally.writers.transactions import read_item
from tests.utils import write_aws_export

RULES = load_rules(Path(__file__).parents[2] / "integration" / "numbers_rules.toml")
LEDGER, LIKES = RULES["ledger"], RULES["likes"]
MISSING = None  # an attribute the item does not have

# --- the reference: exact arithmetic in Python integers, independent of decimal ----------


def _as_int(text: str) -> tuple[int, int]:
    """An N value as (coefficient, exponent), from its text."""
    d = Decimal(text)
    sign, digits, exponent = d.as_tuple()
    coefficient = int("".join(map(str, digits)) or "0")
    assert isinstance(exponent, int)
    return (-coefficient if sign else coefficient), exponent


def ref_sum(texts: list[str]) -> tuple[int, int]:
    """The exact sum as (coefficient, exponent)."""
    if not texts:
        return 0, 0
    parts = [_as_int(t) for t in texts]
    low = min(e for _, e in parts)
    return sum(c * 10 ** (e - low) for c, e in parts), low


def ref_equal(a: tuple[int, int], b: tuple[int, int]) -> bool:
    low = min(a[1], b[1])
    return a[0] * 10 ** (a[1] - low) == b[0] * 10 ** (b[1] - low)


def ref_storable(value: tuple[int, int]) -> bool:
    """Can DynamoDB hold it: at most 38 digits, magnitude 1E-130 .. < 1E+126, or zero."""
    coefficient, exponent = value
    if coefficient == 0:
        return True
    digits = str(abs(coefficient)).rstrip("0")
    exponent += len(str(abs(coefficient))) - len(digits)
    adjusted = exponent + len(digits) - 1
    return len(digits) <= 38 and -130 <= adjusted <= 125


# --- values a foreign writer can put ------------------------------------------------------


@st.composite
def domain_numbers(draw: st.DrawFn) -> str:
    """An N value from DynamoDB's whole domain, as DynamoDB writes it (plain, no exponent)."""
    if draw(st.integers(0, 20)) == 0:
        return "0"
    digits = draw(st.integers(1, 38))
    coefficient = draw(st.integers(10 ** (digits - 1), 10**digits - 1))
    adjusted = draw(st.one_of(st.integers(-130, 125), st.sampled_from([-130, -10, 0, 20, 125])))
    value = Decimal(f"{'-' if draw(st.booleans()) else ''}{coefficient}E{adjusted - digits + 1}")
    return f"{value.normalize(DYNAMODB):f}"


def foreign_values() -> st.SearchStrategy[Any]:
    """Any attribute value (DynamoDB JSON), or MISSING."""
    return st.one_of(
        domain_numbers().map(lambda t: {"N": t}),
        domain_numbers().map(lambda t: {"N": t}),
        st.just(MISSING),
        st.text(max_size=5).map(lambda t: {"S": t}),
        st.binary(max_size=3).map(lambda b: {"B": b}),
        st.booleans().map(lambda b: {"BOOL": b}),
        st.just({"NULL": True}),
        st.just({"L": [{"N": "1"}]}),
        st.just({"M": {"a": {"N": "1"}}}),
        st.just({"NS": ["1", "2"]}),
    )


@dataclass
class Parent:
    """One generated parent of the ledger (sum) or likes (count) rule and its children."""

    rule: Any
    pk: str
    counter: Any
    revision: Any
    amounts: list[Any] = field(default_factory=list)

    @property
    def key(self) -> dict[str, str]:
        return {"PK": self.pk, "SK": "META"}

    def parent_item(self) -> dict[str, Any]:
        item: dict[str, Any] = {"PK": {"S": self.pk}, "SK": {"S": "META"}}
        if self.counter is not MISSING:
            item[self.rule.counter] = self.counter
        if self.revision is not MISSING:
            item["tallyRevision"] = self.revision
        return item

    def children(self) -> list[dict[str, Any]]:
        prefix = "ENTRY#" if self.rule is LEDGER else "LIKE#"
        items = []
        for n, amount in enumerate(self.amounts):
            item = {"PK": {"S": self.pk}, "SK": {"S": f"{prefix}{n}"}}
            if amount is not MISSING:
                item["amount"] = amount
            items.append(item)
        return items

    def expected(self) -> set[tuple[str, str, str]]:
        """(kind, attribute, SK) of every finding the reference expects."""
        found: set[tuple[str, str, str]] = set()
        numbers = []
        for n, amount in enumerate(self.amounts):
            if self.rule is not LEDGER or amount is MISSING:
                continue
            if "N" in amount:
                numbers.append(amount["N"])
            else:
                found.add(("malformed", "amount", f"ENTRY#{n}"))
        truth = ref_sum(numbers) if self.rule is LEDGER else (len(self.amounts), 0)
        counter, revision = self.counter, self.revision
        if counter == {"NULL": True}:
            counter = MISSING  # read as absent (0); a fenced repair cannot write over it
        if counter is not MISSING and "N" not in counter:
            return found | {("invalid_counter", self.rule.counter, "META")}
        stored = _as_int(counter["N"]) if counter is not MISSING else (0, 0)
        if self.rule is LIKES and (stored[0] < 0 or not _integral(stored)):
            return found | {("invalid_counter", self.rule.counter, "META")}
        if ref_equal(stored, truth):
            return found
        if revision is not MISSING and (
            "N" not in revision or not ref_storable(_plus_one(revision["N"]))
        ):
            return found | {("invalid_counter", "tallyRevision", "META")}
        kind = "drift" if ref_storable(truth) else "unrepresentable"
        return found | {(kind, self.rule.counter, "META")}

    def balanced_stream(self) -> bool:
        """The reference's view of the stream path: the writes cancel out exactly."""
        if any(a is not MISSING and "N" not in a for a in self.amounts if self.rule is LEDGER):
            return False
        counter = MISSING if self.counter == {"NULL": True} else self.counter
        if counter is not MISSING and "N" not in counter:
            return False
        stored = _as_int(counter["N"]) if counter is not MISSING else (0, 0)
        if self.rule is LIKES:
            if stored[0] < 0 or not _integral(stored):
                return False
            return ref_equal(stored, (len(self.amounts), 0))
        numbers = [a["N"] for a in self.amounts if a is not MISSING]
        return ref_equal(stored, ref_sum(numbers))


def _integral(value: tuple[int, int]) -> bool:
    coefficient, exponent = value
    return exponent >= 0 or coefficient % 10**-exponent == 0


def _plus_one(text: str) -> tuple[int, int]:
    return ref_sum([text, "1"])


@st.composite
def parents(draw: st.DrawFn, pk: str = "ACCOUNT#1") -> Parent:
    rule = draw(st.sampled_from([LEDGER, LEDGER, LIKES]))
    pk = pk if rule is LEDGER else pk.replace("ACCOUNT", "POST")
    numbers = domain_numbers().map(lambda t: {"N": t})
    amounts = draw(st.lists(st.one_of(numbers, numbers, numbers, foreign_values()), max_size=5))
    revision = draw(
        st.one_of(st.just(MISSING), st.just({"N": "1"}), st.just({"N": "1"}), foreign_values())
    )
    truth_texts = [a["N"] for a in amounts if a is not MISSING and "N" in a]
    coefficient, exponent = ref_sum(truth_texts) if rule is LEDGER else (len(amounts), 0)
    consistent = Decimal(f"{coefficient}E{exponent}")
    choice = draw(st.integers(0, 4))
    if choice == 0 and ref_storable((coefficient, exponent)):
        counter: Any = {"N": f"{fit(consistent).normalize(DYNAMODB):f}"}
    elif choice == 1 and ref_storable((coefficient, exponent)):
        # A rogue change in the lowest digit the total holds (or just below it).
        low = draw(st.sampled_from([exponent, exponent - 1, -130]))
        near = consistent + Decimal(f"1E{low}") if consistent else Decimal(f"1E{low}")
        counter = {"N": f"{near.normalize(DYNAMODB):f}"} if representable(near) else MISSING
    elif choice == 2:
        counter = {"N": draw(domain_numbers())}
    else:
        counter = draw(foreign_values())
    return Parent(rule, pk, counter, revision, amounts)


# --- fakes for the parts that read and write (pure otherwise) -----------------------------


class FakeClient:
    """DynamoDB's answers for one parent: GetItem on it, Query on its children."""

    def __init__(self, parent: Parent):
        self.parent = parent

    def get_item(self, **_: Any) -> dict[str, Any]:
        return {"Item": self.parent.parent_item(), "ConsumedCapacity": {"CapacityUnits": 0.5}}

    def query(self, **request: Any) -> dict[str, Any]:
        """A ``Select=COUNT`` with a ``Limit``: how many children, up to the limit."""
        children = len(self.parent.children())
        counted = min(children, request.get("Limit", children))
        page: dict[str, Any] = {"Count": counted, "ScannedCount": counted}
        if counted < children:
            page["LastEvaluatedKey"] = {"PK": {"S": self.parent.pk}}
        return page

    def get_paginator(self, _: str) -> Any:
        children = self.parent.children()

        class Pages:
            def paginate(self, **__: Any) -> Iterator[dict[str, Any]]:
                yield {"Items": children, "Count": len(children), "ScannedCount": len(children)}

        return Pages()


class FakeCarries:
    """The audit table's carries, in memory."""

    def __init__(self) -> None:
        self.held: dict[Any, Carry] = {}

    def carry(self, rule: str, key: Any) -> Carry:
        return self.held.get((rule, tuple(sorted(key.items()))), Carry())

    def put_carry(self, rule: str, key: Any, previous: Carry, new: Carry) -> bool:
        # Stored as DynamoDB would: it must fit.
        fit(new.remainder)
        assert self.carry(rule, key) == previous
        self.held[rule, tuple(sorted(key.items()))] = new
        return True


class IgnoredStanding:
    def clear_standing(self, *_: Any) -> None:
        pass


class FakeStore:
    """The audit table's parts a dry run without alerts uses: carries in memory, standing
    findings ignored; no other part is reached."""

    def __init__(self) -> None:
        self.carries = FakeCarries()
        self.standing = IgnoredStanding()
        self.log = self.outbox = self.watermarks = self.recent = None


class FakeRechecks:
    def __init__(self) -> None:
        self.due: list[Recheck] = []

    def schedule(self, recheck: Recheck, _: int) -> None:
        self.due.append(recheck)


def reconciler(parent: Parent) -> Reconciler:
    table = TallyTable(FakeClient(parent), "t", RULES)
    checker = Reconciler(
        RULES,
        table,
        FakeStore(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        FakeRechecks(),  # type: ignore[arg-type]
        RepairPolicy(dry_run=True),
        Settle(attempts=2, pause_seconds=0),
        alerting=False,
    )
    return checker


_sequence = itertools.count(1000)


def record(event: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> dict[str, Any]:
    image = new or old or {}
    stream: dict[str, Any] = {
        "Keys": {"PK": image["PK"], "SK": image["SK"]},
        "SequenceNumber": str(next(_sequence)),
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    if new is not None:
        stream["NewImage"] = new
    if old is not None:
        stream["OldImage"] = old
    return {"eventID": stream["SequenceNumber"], "eventName": event, "dynamodb": stream}


def stream_of(parent: Parent) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The children's inserts, then the parent's update from nothing to its counter."""
    children = [record("INSERT", child, None) for child in parent.children()]
    bare = {"PK": {"S": parent.pk}, "SK": {"S": "META"}}
    return children, [record("MODIFY", parent.parent_item(), bare)]


def findings(checker: Reconciler) -> set[tuple[str, str, str]]:
    return {(f.kind, f.attribute, f.key["SK"]) for f in checker.log}


# --- the exact context --------------------------------------------------------------------


@given(st.lists(domain_numbers(), max_size=8))
@settings(max_examples=1000, deadline=None)
def test_exact_sum_is_the_reference_sum_in_any_order(texts: list[str]) -> None:
    values = [parse(t) for t in texts]
    expected = ref_sum(texts)
    for order in (values, values[::-1]):
        total = exact_sum(order)
        assert ref_equal(_as_int(str(total)), expected)
        assert representable(total) == ref_storable(expected)
        if ref_storable(expected):
            assert ref_equal(_as_int(str(fit(total))), expected)
            assert len(fit(total).as_tuple().digits) <= 38
        else:
            with pytest.raises(Unrepresentable):
                fit(total)


@given(domain_numbers())
@settings(max_examples=1000, deadline=None)
def test_every_number_dynamodb_holds_is_read_whole(text: str) -> None:
    value = Deserializer().deserialize({"N": text})
    assert ref_equal(_as_int(str(value)), _as_int(text))
    assert number(value) == value and representable(value)


@pytest.mark.parametrize("text", ["1E-131", "1E+126", "NaN", "Infinity", "1" * 39 + ".5", "x"])
def test_a_number_dynamodb_cannot_hold_is_refused_by_the_reader(text: str) -> None:
    with pytest.raises(ValueError, match="not a DynamoDB number"):
        parse(text)


def test_1e38_written_out_is_read_as_1e38() -> None:
    assert str(parse("1" + "0" * 38)) == "1E+38"
    assert str(parse("-" + "9" * 38 + "0" * 88)) == "-9.9999999999999999999999999999999999999E+125"


@given(domain_numbers())
@settings(max_examples=300, deadline=None)
def test_the_one_reader_reads_a_number_whole_wherever_it_sits(text: str) -> None:
    """core.dynamodb's Deserializer is the only TypeDeserializer subclass: the writers'
    ``read_item`` (which once had its own, for 1E+40 written out as 41 digits) and the
    stream's images both read through it. A number, alone, in a set, a map or a list, is
    one Decimal."""
    raw = {
        "n": {"N": text},
        "ns": {"NS": [text]},
        "m": {"M": {"n": {"N": text}}},
        "l": {"L": [{"N": text}]},
    }
    item = read_item(raw)
    assert item is not None
    value = item["n"]
    assert isinstance(value, Decimal) and ref_equal(_as_int(str(value)), _as_int(text))
    assert item == {"n": value, "ns": {value}, "m": {"n": value}, "l": [value]} == deserialize(raw)


@given(domain_numbers())
@settings(max_examples=1000, deadline=None)
def test_every_number_dynamodb_holds_goes_back_in_a_fence_as_it_was_read(text: str) -> None:
    """boto3's serializer checks numbers with 1E-128 as its smallest exponent: a 38-digit
    number just above 1E-130, which DynamoDB holds, raised Underflow there, so a counter or
    amount like it could never be fenced on, and its group failed at every delivery."""
    value = Deserializer().deserialize({"N": text})
    written = serialize({"n": value, "ns": {value}})
    assert ref_equal(_as_int(written["n"]["N"]), _as_int(text))
    assert deserialize(written) == {"n": value, "ns": {value}}


def test_a_38_digit_number_just_above_1e_minus_130_is_written() -> None:
    text = "1.0000000000000000000000000000000000001E-129"
    assert serialize({"n": parse(text)}) == {"n": {"N": text}}


@pytest.mark.parametrize("text", ["1" + "0" * 40, "-" + "9" * 38 + "0" * 88])
def test_a_large_number_written_out_is_read_so_it_goes_back_in_a_fence(text: str) -> None:
    item = read_item({"n": {"N": text}, "ns": {"NS": [text, "1"]}})
    assert item is not None
    assert deserialize(serialize(item)) == item  # boto3's serializer refused 41 digits


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("x", "counter is not a number: S"),
        (b"x", "counter is not a number: B"),
        (True, "counter is not a number: BOOL"),
        ([1], "counter is not a number: L"),
        ({"a": 1}, "counter is not a number: M"),
        ({Decimal(1)}, "counter is not a number: NS"),
        (Decimal("2.5"), "counter 2.5 is not an integer"),
        (Decimal("-1"), "counter -1 is negative"),
        (Decimal("1E+40"), None),
        (None, None),
    ],
)
def test_what_is_wrong_with_a_counter_is_said_by_type_never_by_value(
    value: Any, said: str | None
) -> None:
    assert counter_problem(value, whole=True) == said


def test_a_fractional_counter_says_counter_2_5_is_not_an_integer() -> None:
    error = InvalidCounterError({"PK": "PROJECT#A"}, "lastIssue", Decimal("2.5"))
    assert str(error).endswith("counter 2.5 is not an integer")
    text = InvalidCounterError({"PK": "PROJECT#A"}, "lastIssue", "kirk@example.com")
    assert "kirk" not in str(text) and str(text).endswith("counter is not a number: S")


# --- the product's decisions over the whole domain ----------------------------------------


@given(parents())
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_path_judges_the_whole_domain_like_the_reference(parent: Parent) -> None:
    """Stream fold, carry, settled recount and judgement, and the scan engine's candidate
    test: no crash, no false finding, no missed one."""
    expected = parent.expected()
    # The stream path: the fast path proves exactly the parents that are balanced.
    children, update = stream_of(parent)
    [group] = group_records(children + update, RULES).groups.values()
    if group.balanced:  # proved from the stream alone: the reference must agree
        assert parent.balanced_stream()
    elif parent.counter != {"NULL": True}:  # a NULL counter is left to the table to judge
        assert not parent.balanced_stream()
    # The carry (children and parent in separate batches), then its recheck, then the
    # recount and judgement: every finding the reference expects, nothing else.
    checker = reconciler(parent)
    for batch in (children, update):
        if batch:
            assert checker.verify_batch(batch) == []
    for recheck in list(checker.rechecks.due):  # type: ignore[attr-defined]
        checker.recheck(recheck)
    assert findings(checker) == expected
    # The recount on its own, as replay and both audit engines run it.
    recount = reconciler(parent)
    recount.audit_parent(parent.rule, parent.key)
    assert findings(recount) == expected
    # The scan engine's candidate test: a parent is a candidate exactly when it has a finding.
    collection: dict[Any, Any] = {}
    reader = Deserializer()
    for item in [parent.parent_item(), *parent.children()]:
        plain = {name: reader.deserialize(value) for name, value in item.items()}
        role = "parent" if plain["SK"] == "META" else "child"
        _tally(collection, parent.rule, role, parent.key, plain)
    [(_, _, seen)] = collection.values()
    assert _disagrees(parent.rule, seen) == bool(expected) or _scan_cannot_tell(parent)


def _scan_cannot_tell(parent: Parent) -> bool:
    """The scan reads a count rule's counter as any number: a fractional or negative one is a
    candidate the recount reports, and never a missed one."""
    return parent.rule is LIKES and bool(parent.expected())


@given(st.lists(parents(), min_size=1, max_size=5))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_export_engine_makes_a_candidate_of_every_parent_with_a_finding(
    tmp_path_factory: pytest.TempPathFactory, drawn: list[Parent]
) -> None:
    """DuckDB's audit query over an export of the generated parents (fewer examples: each
    writes an export and runs DuckDB)."""
    items, expected = [], set()
    for n, parent in enumerate(drawn):
        parent.pk = f"{parent.pk.split('#')[0]}#{n}"
        items += [parent.parent_item(), *parent.children()]
        if parent.expected():
            expected.add(parent.pk)
    exported = [_export_json(item) for item in items]
    directory = write_aws_export(tmp_path_factory.mktemp("export"), exported)
    query = AuditQuery(list(RULES), RULES.table)
    found = {c.key["PK"] for c in candidates(query, read_export(directory), RULES)}
    assert expected <= found


def _export_json(item: dict[str, Any]) -> dict[str, Any]:
    """DynamoDB JSON as the export writes it: binary base64-encoded."""
    out = {}
    for name, value in item.items():
        if "B" in value:
            out[name] = {"B": base64.b64encode(value["B"]).decode()}
        else:
            out[name] = value
    return out


def test_a_fractional_counter_finding_says_what_is_wrong() -> None:
    parent = Parent(LIKES, "POST#1", {"N": "2.5"}, MISSING, [MISSING, MISSING])
    checker = reconciler(parent)
    checker.audit_parent(LIKES, parent.key)
    [finding] = checker.log
    assert (finding.kind, finding.stored) == ("invalid_counter", Decimal("2.5"))
    assert "counter 2.5 is not an integer" in finding.detail
    assert "Decimal" not in finding.detail


def test_a_binary_of_bytes_or_of_a_bytearray_is_named_b_never_shown() -> None:
    from boto3.dynamodb.types import Binary

    for value in (b"\x00secret", bytearray(b"secret"), Binary(b"secret"), Binary(bytearray(b"s"))):
        assert type_name(value) == "B"
