"""Repeats on DynamoDB Local: legitimate repeats count, idempotency keys answer once."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tally.rules import load_rules
from tally.writers import (
    IdempotencyConflictError,
    SequenceAllocator,
    TallyWriter,
    WriteResult,
)
from tally.writers.idempotency import WINDOW_SECONDS
from tests.integration.test_writers import get, put

RULES = load_rules()
POST = {"PK": "POST#a91f", "SK": "META"}
LIKE = {"PK": "POST#a91f", "SK": "LIKE#USER#7c20"}
ORDER = {"PK": "ORDER#17", "SK": "META"}
LINE = {"PK": "ORDER#17", "SK": "LINE#3"}
PROJECT = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
USERS = {"PK": "UserMetadata", "SK": "META"}
KIRK = {"PK": "User#Kirk", "SK": "PROFILE"}


@pytest.fixture
def writer(dynamodb: Any, table_name: str) -> TallyWriter:
    put(dynamodb, table_name, {**POST, "likeTally": 0})
    put(dynamodb, table_name, {**ORDER, "total": 0})
    return TallyWriter(dynamodb, table_name, RULES)


@pytest.fixture
def allocator(dynamodb: Any, table_name: str) -> SequenceAllocator:
    return SequenceAllocator(dynamodb, table_name, RULES)


def total(dynamodb: Any, table: str) -> Any:
    return (get(dynamodb, table, ORDER["PK"], ORDER["SK"]) or {}).get("total")


def likes(dynamodb: Any, table: str) -> Any:
    return (get(dynamodb, table, POST["PK"], POST["SK"]) or {}).get("likeTally")


# --- legitimate repeats without keys ------------------------------------------------------


def test_amounts_a_b_a_b_each_change_the_line(writer, dynamodb, table_name) -> None:
    outcomes = [writer.add_child(LINE, {"amount": 5}).outcome]
    outcomes += [writer.change_amount(LINE, amount).outcome for amount in (7, 5, 7)]
    assert outcomes == ["created", "changed", "changed", "changed"]
    assert get(dynamodb, table_name, LINE["PK"], LINE["SK"])["amount"] == 7  # type: ignore[index]
    assert total(dynamodb, table_name) == 7


def test_the_same_amount_again_is_unchanged_and_writes_nothing(writer, dynamodb, table_name):
    writer.add_child(LINE, {"amount": Decimal("12.50")})
    assert writer.change_amount(LINE, Decimal("12.5")) == WriteResult("unchanged")
    assert total(dynamodb, table_name) == Decimal("12.5")


def test_remove_then_add_again_counts_both(writer, dynamodb, table_name) -> None:
    outcomes = [
        writer.add_child(LINE, {"amount": 3}).outcome,
        writer.remove_child(LINE).outcome,
        writer.add_child(LINE, {"amount": 3}).outcome,
        writer.remove_child(LINE).outcome,
        writer.remove_child(LINE).outcome,
    ]
    assert outcomes == ["created", "removed", "created", "removed", "not_present"]
    assert total(dynamodb, table_name) == 0


def test_like_unlike_like_unlike_each_report_what_they_did(writer, dynamodb, table_name) -> None:
    calls = [writer.add_child, writer.remove_child] * 2 + [writer.add_child] * 2
    outcomes = [call(LIKE) for call in calls]
    assert [r.outcome for r in outcomes] == [
        "created",
        "removed",
        "created",
        "removed",
        "created",
        "already_present",
    ]
    assert not any(r.replayed for r in outcomes)
    assert likes(dynamodb, table_name) == 1


# --- the same key, the same request -------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        (lambda w: w.add_child(LIKE, idempotency_key="k"), "created"),
        (lambda w: w.add_child(LINE, {"amount": 5}, idempotency_key="k"), "created"),
        (lambda w: w.remove_child(LIKE, idempotency_key="k"), "not_present"),
        (lambda w: w.change_amount(LINE, 5, idempotency_key="k"), "not_present"),
    ],
)
def test_the_same_key_and_request_answer_the_first_outcome(
    writer, dynamodb, table_name, first, expected
) -> None:
    original = first(writer)
    state = dynamodb.scan(TableName=table_name, ConsistentRead=True)["Items"]
    again = first(writer)
    assert original == WriteResult(expected)
    assert again == WriteResult(expected, replayed=True)
    assert dynamodb.scan(TableName=table_name, ConsistentRead=True)["Items"] == state


def test_keyed_remove_and_change_replay_their_writes(writer, dynamodb, table_name) -> None:
    writer.add_child(LINE, {"amount": 5})
    writer.add_child(LIKE)
    assert writer.change_amount(LINE, 9, idempotency_key="c").outcome == "changed"
    assert writer.change_amount(LINE, 9, idempotency_key="c") == WriteResult("changed", True)
    assert writer.remove_child(LIKE, idempotency_key="r").outcome == "removed"
    assert writer.remove_child(LIKE, idempotency_key="r") == WriteResult("removed", True)
    assert (total(dynamodb, table_name), likes(dynamodb, table_name)) == (9, 0)


def test_a_no_op_outcome_is_kept_under_its_key(writer, dynamodb, table_name) -> None:
    writer.add_child(LIKE)
    assert writer.add_child(LIKE, idempotency_key="dup") == WriteResult("already_present")
    assert writer.add_child(LIKE, idempotency_key="dup") == WriteResult("already_present", True)
    assert likes(dynamodb, table_name) == 1


# --- the same key, another request --------------------------------------------------------


@pytest.mark.parametrize(
    "other",
    [
        lambda w: w.add_child(LINE, {"amount": 6}, idempotency_key="k"),
        lambda w: w.add_child({**LINE, "SK": "LINE#4"}, {"amount": 5}, idempotency_key="k"),
        lambda w: w.remove_child(LINE, idempotency_key="k"),
        lambda w: w.change_amount(LINE, 6, idempotency_key="k"),
    ],
)
def test_the_same_key_for_another_request_is_a_conflict_that_writes_nothing(
    writer, dynamodb, table_name, other
) -> None:
    writer.add_child(LINE, {"amount": 5}, idempotency_key="k")
    state = dynamodb.scan(TableName=table_name, ConsistentRead=True)["Items"]
    with pytest.raises(IdempotencyConflictError) as raised:
        other(writer)
    assert raised.value.reason == "mismatch"
    assert dynamodb.scan(TableName=table_name, ConsistentRead=True)["Items"] == state


def test_add_remove_add_with_one_key_never_claims_a_like_that_is_gone(
    writer, dynamodb, table_name
) -> None:
    assert writer.add_child(LIKE, idempotency_key="like-1").outcome == "created"
    assert writer.remove_child(LIKE).outcome == "removed"
    with pytest.raises(IdempotencyConflictError) as raised:
        writer.add_child(LIKE, idempotency_key="like-1")
    assert raised.value.reason == "superseded"
    assert get(dynamodb, table_name, LIKE["PK"], LIKE["SK"]) is None
    assert likes(dynamodb, table_name) == 0
    assert writer.add_child(LIKE, idempotency_key="like-2") == WriteResult("created")


def test_a_change_undone_by_another_request_is_superseded(writer, dynamodb, table_name) -> None:
    writer.add_child(LINE, {"amount": 5})
    writer.change_amount(LINE, 7, idempotency_key="to-7")
    writer.change_amount(LINE, 5)
    with pytest.raises(IdempotencyConflictError) as raised:
        writer.change_amount(LINE, 7, idempotency_key="to-7")
    assert raised.value.reason == "superseded"
    assert total(dynamodb, table_name) == 5


def test_a_key_is_free_again_after_its_window(writer, dynamodb, table_name, monkeypatch) -> None:
    writer.add_child(LIKE, idempotency_key="old")
    writer.remove_child(LIKE)
    later = writer.guards.clock() + WINDOW_SECONDS + 1
    monkeypatch.setattr(writer.guards, "clock", lambda: later)
    assert writer.add_child(LIKE, idempotency_key="old") == WriteResult("created")
    assert likes(dynamodb, table_name) == 1


def test_guards_expire_through_the_tables_ttl_attribute(writer, dynamodb, table_name) -> None:
    writer.add_child(LIKE, idempotency_key="ttl")
    guards = [
        item
        for item in dynamodb.scan(TableName=table_name, ConsistentRead=True)["Items"]
        if item["PK"]["S"].startswith("tallyIdempotency#")
    ]
    assert len(guards) == 1
    assert "expiresAt" in guards[0]  # the bundled rules name the template's TTL attribute
    assert "ttl" not in str(guards[0])  # the key itself is stored only as a digest


# --- allocations --------------------------------------------------------------------------


@pytest.mark.parametrize(("strategy", "count"), [("atomic", 1), ("gapless", 1), ("sortkey", 1)])
def test_a_keyed_allocation_repeated_answers_its_numbers_without_allocating(
    allocator, dynamodb, table_name, strategy, count
) -> None:
    first = allocator.allocate(PROJECT, strategy=strategy, idempotency_key="issue-1")
    again = allocator.allocate(PROJECT, strategy=strategy, idempotency_key="issue-1")
    assert (first.numbers, first.replayed) == ((1,), False)
    assert (again.numbers, again.member_keys, again.replayed) == ((1,), first.member_keys, True)
    assert get(dynamodb, table_name, PROJECT["PK"], PROJECT["SK"])["lastIssue"] == 1  # type: ignore[index]


def test_a_keyed_block_repeated_answers_the_whole_block(allocator, dynamodb, table_name) -> None:
    first = allocator.allocate(PROJECT, strategy="block", count=98, idempotency_key="b")
    again = allocator.allocate(PROJECT, strategy="block", count=98, idempotency_key="b")
    assert first.numbers == again.numbers == tuple(range(1, 99))
    assert again.replayed
    assert get(dynamodb, table_name, PROJECT["PK"], PROJECT["SK"])["lastIssue"] == 98  # type: ignore[index]


def test_a_key_reused_for_another_allocation_is_a_conflict(allocator, dynamodb, table_name):
    allocator.allocate(PROJECT, attributes={"title": "a"}, idempotency_key="k")
    with pytest.raises(IdempotencyConflictError) as raised:
        allocator.allocate(PROJECT, attributes={"title": "b"}, idempotency_key="k")
    assert raised.value.reason == "mismatch"
    assert get(dynamodb, table_name, PROJECT["PK"], PROJECT["SK"])["lastIssue"] == 1  # type: ignore[index]


def test_a_keyed_registration_of_an_existing_user_is_kept(allocator, dynamodb, table_name):
    allocator.allocate(USERS, member_key=KIRK)
    first = allocator.allocate(USERS, member_key=KIRK, idempotency_key="kirk")
    again = allocator.allocate(USERS, member_key=KIRK, idempotency_key="kirk")
    assert (first.outcome, first.numbers, first.replayed) == ("already_present", (1,), False)
    assert (again.outcome, again.numbers, again.replayed) == ("already_present", (1,), True)
