"""The transactional writers on DynamoDB Local, under real threads."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from tally.rules import load_rules
from tally.writers import (
    CounterBehindError,
    IdempotencyConflictError,
    InvalidCounterError,
    ParentNotFoundError,
    SequenceAllocator,
    TallyWriter,
    WriteResult,
)
from tests.integration.conftest import RULES_FILE

RULES = load_rules(RULES_FILE)
THREADS = 16
_ser, _de = TypeSerializer(), TypeDeserializer()


def put(client: Any, table: str, item: dict[str, Any]) -> None:
    client.put_item(TableName=table, Item={k: _ser.serialize(v) for k, v in item.items()})


def get(client: Any, table: str, pk: str, sk: str) -> dict[str, Any] | None:
    response = client.get_item(
        TableName=table, Key={"PK": {"S": pk}, "SK": {"S": sk}}, ConsistentRead=True
    )
    item = response.get("Item")
    return {k: _de.deserialize(v) for k, v in item.items()} if item else None


def children(client: Any, table: str, pk: str, prefix: str) -> list[dict[str, Any]]:
    paginator = client.get_paginator("query")
    pages = paginator.paginate(
        TableName=table,
        KeyConditionExpression="PK = :pk AND begins_with(SK, :prefix)",
        ExpressionAttributeValues={":pk": {"S": pk}, ":prefix": {"S": prefix}},
        ConsistentRead=True,
    )
    return [{k: _de.deserialize(v) for k, v in i.items()} for p in pages for i in p["Items"]]


def in_threads(work: Callable[[int], Any], threads: int = THREADS) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(work, range(threads)))


@pytest.fixture
def writer(dynamodb: Any, table_name: str) -> TallyWriter:
    return TallyWriter(dynamodb, table_name, RULES)


@pytest.fixture
def allocator(dynamodb: Any, table_name: str) -> SequenceAllocator:
    return SequenceAllocator(dynamodb, table_name, RULES)


def test_threads_liking_and_unliking_with_duplicates_and_retries_keep_counts_exact(
    dynamodb: Any, table_name: str, writer: TallyWriter
) -> None:
    posts = [f"POST#{n}" for n in range(3)]
    for post in posts:
        put(dynamodb, table_name, {"PK": post, "SK": "META", "likeTally": 0})

    def client_session(thread: int) -> Counter[str]:
        rng = random.Random(thread)
        outcomes: Counter[str] = Counter()
        for step in range(40):
            key = {"PK": rng.choice(posts), "SK": f"LIKE#USER#{rng.randrange(12)}"}
            write = writer.add_child if rng.random() < 0.6 else writer.remove_child
            idempotency_key = f"{thread}-{step}" if rng.random() < 0.5 else None
            result = write(key, idempotency_key=idempotency_key)
            outcomes[result.outcome] += 1
            if rng.random() < 0.3:  # the client retries the same request, or double-clicks
                try:
                    again = write(key, idempotency_key=idempotency_key)
                except IdempotencyConflictError as conflict:
                    # Another thread undid the write in between: the key says so, writes nothing.
                    assert idempotency_key and conflict.reason == "superseded"
                    continue
                if idempotency_key:
                    assert again == WriteResult(result.outcome, replayed=True)
                else:
                    outcomes[again.outcome] += 1
        return outcomes

    totals = sum(in_threads(client_session), Counter())
    likes = sum(len(children(dynamodb, table_name, post, "LIKE#")) for post in posts)
    assert totals["created"] - totals["removed"] == likes
    for post in posts:
        parent = get(dynamodb, table_name, post, "META")
        assert parent is not None
        assert parent["likeTally"] == len(children(dynamodb, table_name, post, "LIKE#"))
    revisions = sum(get(dynamodb, table_name, p, "META")["tallyRevision"] for p in posts)  # type: ignore[index]
    assert revisions == totals["created"] + totals["removed"]


@pytest.mark.parametrize(("strategy", "count"), [("gapless", 1), ("sortkey", 1), ("block", 5)])
def test_threads_allocating_get_exactly_one_to_n(
    dynamodb: Any, table_name: str, allocator: SequenceAllocator, strategy: str, count: int
) -> None:
    counter = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
    calls = 6

    def allocate(_: int) -> list[int]:
        numbers: list[int] = []
        for _ in range(calls):
            result = allocator.allocate(counter, strategy=strategy, count=count)  # type: ignore[arg-type]
            numbers.extend(result.numbers)
        return numbers

    handed_out = sorted(n for numbers in in_threads(allocate) for n in numbers)
    total = THREADS * calls * count
    assert handed_out == list(range(1, total + 1))
    members = children(dynamodb, table_name, "PROJECT#A", "ISSUE#")
    assert sorted(RULES["issue-numbers"].member_number(m["SK"]) for m in members) == handed_out  # type: ignore[union-attr]
    assert get(dynamodb, table_name, "PROJECT#A", "COUNTER#ISSUE")["lastIssue"] == total  # type: ignore[index]


def test_threads_allocating_natural_key_members_get_unique_numbers_through_the_index(
    dynamodb: Any, table_name: str, allocator: SequenceAllocator
) -> None:
    counter = {"PK": "UserMetadata", "SK": "META"}

    def register(thread: int) -> list[int]:
        numbers = []
        for n in range(4):
            member = {"PK": f"User#{thread}-{n}", "SK": "PROFILE"}
            strategy = "gapless" if n % 2 else "atomic"
            numbers.extend(
                allocator.allocate(counter, strategy=strategy, member_key=member).numbers
            )  # type: ignore[arg-type]
        return numbers

    numbers = sorted(n for batch in in_threads(register) for n in batch)
    assert numbers == list(range(1, THREADS * 4 + 1))
    pages = dynamodb.get_paginator("query").paginate(
        TableName=table_name,
        IndexName="SequenceIndex",
        KeyConditionExpression="seqName = :s",
        ExpressionAttributeValues={":s": {"S": "user-numbers"}},
    )
    indexed = sorted(int(i["NumIdentifier"]["N"]) for p in pages for i in p["Items"])
    assert indexed == numbers


def test_registering_an_existing_user_returns_their_number_and_leaves_the_counter(
    dynamodb: Any, table_name: str, allocator: SequenceAllocator
) -> None:
    counter = {"PK": "UserMetadata", "SK": "META"}
    kirk = {"PK": "User#Kirk", "SK": "PROFILE"}
    first = allocator.allocate(counter, member_key=kirk, attributes={"UserName": "Kirk"})
    again = allocator.allocate(counter, member_key=kirk, attributes={"UserName": "Kirk"})
    assert (first.outcome, again.outcome) == ("allocated", "already_present")
    assert again.numbers == first.numbers == (1,)
    assert get(dynamodb, table_name, "UserMetadata", "META")["LastID"] == 1  # type: ignore[index]


def test_atomic_crash_between_increment_and_put_leaves_a_gap(
    dynamodb: Any, table_name: str, allocator: SequenceAllocator
) -> None:
    counter = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
    allocator.allocate(counter, strategy="atomic")
    with (
        mock.patch.object(allocator, "_put_members", side_effect=RuntimeError("client crashed")),
        pytest.raises(RuntimeError),
    ):
        allocator.allocate(counter, strategy="atomic")
    allocator.allocate(counter, strategy="atomic")
    members = children(dynamodb, table_name, "PROJECT#A", "ISSUE#")
    assert [m["SK"] for m in members] == ["ISSUE#0000000001", "ISSUE#0000000003"]
    assert get(dynamodb, table_name, "PROJECT#A", "COUNTER#ISSUE")["lastIssue"] == 3  # type: ignore[index]


def test_gapless_refuses_a_number_a_member_already_holds(
    dynamodb: Any, table_name: str, allocator: SequenceAllocator
) -> None:
    counter = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
    for _ in range(3):
        allocator.allocate(counter)
    put(dynamodb, table_name, {**counter, "lastIssue": 0})  # a rogue reset (seed 003)
    with pytest.raises(CounterBehindError) as raised:
        allocator.allocate(counter)
    assert raised.value.number == 1
    assert get(dynamodb, table_name, "PROJECT#A", "COUNTER#ISSUE")["lastIssue"] == 0  # type: ignore[index]


def test_a_retry_with_the_same_idempotency_key_is_counted_once(
    dynamodb: Any, table_name: str, writer: TallyWriter
) -> None:
    put(dynamodb, table_name, {"PK": "ORDER#17", "SK": "META", "total": 0})
    line = {"PK": "ORDER#17", "SK": "LINE#1"}
    first = writer.add_child(line, {"amount": Decimal("19.99")}, idempotency_key="req-1")
    retry = writer.add_child(line, {"amount": Decimal("19.99")}, idempotency_key="req-1")
    assert (first.outcome, first.replayed) == ("created", False)
    assert (retry.outcome, retry.replayed) == ("created", True)
    assert get(dynamodb, table_name, "ORDER#17", "META")["total"] == Decimal("19.99")  # type: ignore[index]


def test_like_unlike_like_without_keys_is_not_swallowed_by_the_derived_token(
    dynamodb: Any, table_name: str, writer: TallyWriter
) -> None:
    put(dynamodb, table_name, {"PK": "POST#a91f", "SK": "META", "likeTally": 0})
    like = {"PK": "POST#a91f", "SK": "LIKE#USER#7c20"}
    outcomes = [
        writer.add_child(like).outcome,
        writer.remove_child(like).outcome,
        writer.add_child(like).outcome,
        writer.add_child(like).outcome,
    ]
    assert outcomes == ["created", "removed", "created", "already_present"]
    assert get(dynamodb, table_name, "POST#a91f", "META")["likeTally"] == 1  # type: ignore[index]
    assert get(dynamodb, table_name, "POST#a91f", "LIKE#USER#7c20") is not None


def test_concurrent_sum_writes_are_exact_in_decimal(
    dynamodb: Any, table_name: str, writer: TallyWriter
) -> None:
    put(dynamodb, table_name, {"PK": "ORDER#9", "SK": "META", "total": 0})

    def shop(thread: int) -> None:
        rng = random.Random(thread)
        for n in range(6):
            line = {"PK": "ORDER#9", "SK": f"LINE#{thread}-{n}"}
            writer.add_child(line, {"amount": Decimal(rng.randrange(1, 10_000)) / 100})
            shared = {"PK": "ORDER#9", "SK": f"LINE#shared-{n % 2}"}
            writer.add_child(shared, {"amount": Decimal("0.10")})
            writer.change_amount(shared, Decimal(rng.randrange(1, 1000)) / 100)
            if rng.random() < 0.3:
                writer.remove_child(line)

    in_threads(shop)
    lines = children(dynamodb, table_name, "ORDER#9", "LINE#")
    total = get(dynamodb, table_name, "ORDER#9", "META")["total"]  # type: ignore[index]
    assert total == sum(line["amount"] for line in lines)
    assert isinstance(total, Decimal)


def test_a_string_in_the_counter_is_refused_and_nothing_is_written(
    dynamodb: Any, table_name: str, writer: TallyWriter, allocator: SequenceAllocator
) -> None:
    put(dynamodb, table_name, {"PK": "POST#bad", "SK": "META", "likeTally": "12"})
    with pytest.raises(InvalidCounterError, match="likeTally"):
        writer.add_child({"PK": "POST#bad", "SK": "LIKE#USER#1"})
    assert get(dynamodb, table_name, "POST#bad", "LIKE#USER#1") is None
    put(dynamodb, table_name, {"PK": "PROJECT#B", "SK": "COUNTER#ISSUE", "lastIssue": "7"})
    for strategy in ("atomic", "gapless"):
        with pytest.raises(InvalidCounterError, match="lastIssue"):
            allocator.allocate({"PK": "PROJECT#B", "SK": "COUNTER#ISSUE"}, strategy=strategy)  # type: ignore[arg-type]
    assert children(dynamodb, table_name, "PROJECT#B", "ISSUE#") == []


def test_a_missing_parent_is_an_error_and_nothing_is_written(
    dynamodb: Any, table_name: str, writer: TallyWriter
) -> None:
    with pytest.raises(ParentNotFoundError) as raised:
        writer.add_child({"PK": "POST#ghost", "SK": "LIKE#USER#1"})
    assert raised.value.key == {"PK": "POST#ghost", "SK": "META"}
    assert get(dynamodb, table_name, "POST#ghost", "LIKE#USER#1") is None


def test_an_oversized_block_is_refused_before_any_write(
    dynamodb: Any, table_name: str, allocator: SequenceAllocator
) -> None:
    with pytest.raises(ValueError, match="'count'"):
        allocator.allocate({"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}, strategy="block", count=100)
    assert get(dynamodb, table_name, "PROJECT#A", "COUNTER#ISSUE") is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w: w.add_child({"PK": "NOTE#1", "SK": "X"}), "not a child of any"),
        (lambda w: w.add_child({"PK": "POST#1"}), "exactly the attributes"),
        (lambda w: w.add_child({"PK": "ORDER#1", "SK": "LINE#1"}, {"amount": 0.1}), "floats"),
        (lambda w: w.change_amount({"PK": "POST#1", "SK": "LIKE#U"}, 1), "only sum children"),
    ],
)
def test_bad_writer_input_names_the_problem_and_writes_nothing(
    dynamodb: Any, table_name: str, writer: TallyWriter, call: Any, message: str
) -> None:
    put(dynamodb, table_name, {"PK": "ORDER#1", "SK": "META", "total": 0})
    with pytest.raises(ValueError, match=message):
        call(writer)
    scan = dynamodb.scan(TableName=table_name, ConsistentRead=True)
    assert [i["PK"]["S"] for i in scan["Items"]] == ["ORDER#1"]
