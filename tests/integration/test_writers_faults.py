"""Every writer operation with responses lost after commit: each outcome against the table's truth.

The writers get a client of their own wired to the fault harness: ``LOSS`` of all attempts
(every DynamoDB operation they call) commit and then lose their response, so botocore
resends them. Before and after each call the truth is read through a clean client, and the
outcome the call returned must be exactly the change the table shows. A third of the calls
carry an idempotency key, and some of those are repeated at once.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tally.local.dynamodb_local import local_client_kwargs
from tally.rules import load_rules
from tally.writers import SequenceAllocator, TallyWriter
from tests.harness.faults import Faults
from tests.utils import deserialize, serialize

RULES = load_rules()
LOSS = 0.3
CALLS = int(os.environ.get("TALLY_FAULT_CALLS", "25"))  # per operation; raise it for a long run
POST = {"PK": "POST#f", "SK": "META"}
ORDER = {"PK": "ORDER#f", "SK": "META"}
PROJECT = {"PK": "PROJECT#f", "SK": "COUNTER#ISSUE"}
USERS = {"PK": "UserMetadata", "SK": "META"}


@dataclass
class Tally:
    """One operation's run: calls made, responses lost, outcomes that differed from truth."""

    operation: str
    calls: int = 0
    lost: int = 0
    differing: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> None:
        self.calls += 1
        if not ok:
            self.differing.append(what)


@pytest.fixture
def faulty(dynamodb_endpoint: str) -> Any:
    """The writers' own client: the harness hooks into it alone."""
    config = Config(retries={"mode": "standard", "max_attempts": 5})
    return boto3.client("dynamodb", config=config, **local_client_kwargs(dynamodb_endpoint))


@pytest.fixture
def truth(dynamodb: Any, table_name: str) -> Callable[[dict[str, str]], dict[str, Any] | None]:
    def read(key: dict[str, str]) -> dict[str, Any] | None:
        response = dynamodb.get_item(TableName=table_name, Key=serialize(key), ConsistentRead=True)
        return deserialize(response["Item"]) if "Item" in response else None

    return read


def put(dynamodb: Any, table: str, item: dict[str, Any]) -> None:
    dynamodb.put_item(TableName=table, Item=serialize(item))


def report(tally: Tally, faults: Faults) -> None:
    tally.lost = faults.total().lost
    print(
        f"\n[faults] {tally.operation}: calls={tally.calls} lost={tally.lost} "
        f"differing={len(tally.differing)} (loss rate {LOSS})"
    )
    assert tally.lost > 0, "the harness lost no response: the run proves nothing"
    assert tally.differing == []


def key_for(rng: random.Random, step: int) -> str | None:
    return f"key-{rng.random()}-{step}" if step % 3 == 0 else None


# --- count and sum children -----------------------------------------------------------


@pytest.mark.parametrize("operation", ["add_child", "remove_child"])
def test_likes_under_lost_responses_report_exactly_what_happened(
    operation: str, faulty: Any, dynamodb: Any, table_name: str, truth: Any
) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": 0, "tallyRevision": 0})
    writer = TallyWriter(faulty, table_name, RULES)
    helper = TallyWriter(dynamodb, table_name, RULES)  # shuffles the state, never faulted
    rng = random.Random(operation)
    tally = Tally(operation)
    pool = [{"PK": POST["PK"], "SK": f"LIKE#USER#{n}"} for n in range(4)]
    with Faults(faulty, lost=LOSS, seed=1) as faults:
        for step in range(CALLS):
            like = rng.choice(pool)
            if rng.random() < 0.5:
                shuffle = helper.remove_child if operation == "add_child" else helper.add_child
                shuffle(like)
            before, parent = truth(like), truth(POST)
            idempotency_key = key_for(rng, step)
            write = getattr(writer, operation)
            result = write(like, idempotency_key=idempotency_key)
            after, parent_after = truth(like), truth(POST)
            tally.check(
                _tally_holds(result.outcome, before, after, parent, parent_after, Decimal(1)),
                f"step {step}: {result} {before} -> {after}",
            )
            if idempotency_key and rng.random() < 0.5:
                again = write(like, idempotency_key=idempotency_key)
                tally.check(
                    again.replayed
                    and again.outcome == result.outcome
                    and truth(like) == after
                    and truth(POST) == parent_after,
                    f"step {step} repeated: {again}",
                )
    report(tally, faults)


def test_amount_changes_under_lost_responses_report_exactly_what_happened(
    faulty: Any, dynamodb: Any, table_name: str, truth: Any
) -> None:
    put(dynamodb, table_name, {**ORDER, "total": 0, "tallyRevision": 0})
    writer = TallyWriter(faulty, table_name, RULES)
    helper = TallyWriter(dynamodb, table_name, RULES)
    rng = random.Random("change_amount")
    tally = Tally("change_amount")
    lines = [{"PK": ORDER["PK"], "SK": f"LINE#{n}"} for n in range(3)]
    amounts = [Decimal("5"), Decimal("7"), Decimal("0.25")]  # A -> B -> A repeats on purpose
    with Faults(faulty, lost=LOSS, seed=2) as faults:
        for step in range(CALLS):
            line = rng.choice(lines)
            if truth(line) is None and rng.random() < 0.8:
                helper.add_child(line, {"amount": rng.choice(amounts)})
            before, parent = truth(line), truth(ORDER)
            new = rng.choice(amounts)
            idempotency_key = key_for(rng, step)
            result = writer.change_amount(line, new, idempotency_key=idempotency_key)
            after, parent_after = truth(line), truth(ORDER)
            tally.check(
                _amount_holds(result.outcome, new, before, after, parent, parent_after),
                f"step {step}: {result} {before} -> {after}",
            )
            if idempotency_key and rng.random() < 0.5:
                again = writer.change_amount(line, new, idempotency_key=idempotency_key)
                tally.check(
                    again.replayed and again.outcome == result.outcome and truth(line) == after,
                    f"step {step} repeated: {again}",
                )
    report(tally, faults)


def _tally_holds(
    outcome: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    parent: Any,
    parent_after: Any,
    delta: Decimal,
) -> bool:
    moved = parent_after["likeTally"] - parent["likeTally"]
    revised = parent_after["tallyRevision"] - parent["tallyRevision"]
    if outcome == "created":
        return before is None and after is not None and (moved, revised) == (delta, 1)
    if outcome == "removed":
        return before is not None and after is None and (moved, revised) == (-delta, 1)
    if outcome in ("already_present", "not_present"):
        present = outcome == "already_present"
        return (before is not None) == present and after == before and parent_after == parent
    return False


def _amount_holds(
    outcome: str,
    new: Decimal,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    parent: Any,
    parent_after: Any,
) -> bool:
    moved = parent_after["total"] - parent["total"]
    revised = parent_after["tallyRevision"] - parent["tallyRevision"]
    if outcome == "changed":
        return (
            before is not None
            and after is not None
            and before["amount"] != new
            and after["amount"] == new
            and (moved, revised) == (new - before["amount"], 1)
        )
    if outcome == "unchanged":
        return before is not None and before["amount"] == new and parent_after == parent
    if outcome == "not_present":
        return before is None and after is None and parent_after == parent
    return False


# --- sequences ----------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["atomic", "gapless", "sortkey", "block"])
def test_allocations_under_lost_responses_hand_out_exactly_what_they_report(
    strategy: str, faulty: Any, dynamodb: Any, table_name: str, truth: Any
) -> None:
    allocator = SequenceAllocator(faulty, table_name, RULES)
    rng = random.Random(strategy)
    tally = Tally(f"allocate {strategy}")
    count = 3 if strategy == "block" else 1
    with Faults(faulty, lost=LOSS, seed=3) as faults:
        for step in range(CALLS):
            start = int((truth(PROJECT) or {}).get("lastIssue", 0))
            idempotency_key = key_for(rng, step)
            result = allocator.allocate(
                PROJECT,
                strategy=strategy,  # type: ignore[arg-type]
                count=count,
                attributes={"call": step},
                idempotency_key=idempotency_key,
            )
            expected = tuple(range(start + 1, start + count + 1))
            members = [truth(key) for key in result.member_keys]
            tally.check(
                result.numbers == expected
                and int(truth(PROJECT)["lastIssue"]) == expected[-1]  # type: ignore[index]
                and all(m is not None and m["call"] == step for m in members),
                f"step {step}: {result} from counter {start}",
            )
            if idempotency_key and rng.random() < 0.5:
                again = allocator.allocate(
                    PROJECT,
                    strategy=strategy,  # type: ignore[arg-type]
                    count=count,
                    attributes={"call": step},
                    idempotency_key=idempotency_key,
                )
                tally.check(
                    again.replayed
                    and again.numbers == result.numbers
                    and int(truth(PROJECT)["lastIssue"]) == expected[-1],  # type: ignore[index]
                    f"step {step} repeated: {again}",
                )
    report(tally, faults)


def test_natural_key_registrations_under_lost_responses(
    faulty: Any, dynamodb: Any, table_name: str, truth: Any
) -> None:
    allocator = SequenceAllocator(faulty, table_name, RULES)
    rng = random.Random("users")
    tally = Tally("allocate natural keys")
    names = [f"User#{n}" for n in range(25)]
    with Faults(faulty, lost=LOSS, seed=4) as faults:
        for step in range(CALLS):
            user = {"PK": rng.choice(names), "SK": "PROFILE"}
            before = truth(user)
            start = int((truth(USERS) or {}).get("LastID", 0))
            strategy = rng.choice(["atomic", "gapless"])
            result = allocator.allocate(USERS, strategy=strategy, member_key=user)  # type: ignore[arg-type]
            after = truth(user)
            counter = int(truth(USERS)["LastID"])  # type: ignore[index]
            if before is None:
                ok = (
                    result.outcome == "allocated"
                    and result.numbers == (start + 1,)
                    and after is not None
                    and after["NumIdentifier"] == start + 1
                    and counter == start + 1
                )
            else:
                burnt: tuple[
                    int, ...
                ] = ()  # a registered key is answered before any number is taken
                ok = (
                    result.outcome == "already_present"
                    and result.numbers == (before["NumIdentifier"],)
                    and result.wasted == burnt
                    and after == before
                    and counter == start + len(burnt)
                )
            tally.check(ok, f"step {step} {strategy}: {result} from counter {start}, {before}")
    report(tally, faults)


# --- the cases the issue named ------------------------------------------------------------


def test_a_first_like_whose_response_is_lost_reports_created(
    faulty: Any, dynamodb: Any, table_name: str, truth: Any
) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": 0})
    like = {"PK": POST["PK"], "SK": "LIKE#USER#7c20"}
    with Faults(faulty, lost=1.0, operations={"TransactWriteItems"}) as faults:
        result = TallyWriter(faulty, table_name, RULES).add_child(like)
    assert faults.stats["TransactWriteItems"].lost >= 1
    assert (result.outcome, result.replayed) == ("created", False)
    assert truth(POST)["likeTally"] == 1  # type: ignore[index]


@pytest.mark.parametrize("lost", ["UpdateItem", "TransactWriteItems"])
def test_an_atomic_allocation_whose_response_is_lost_learns_its_number(
    lost: str, faulty: Any, table_name: str, truth: Any
) -> None:
    allocator = SequenceAllocator(faulty, table_name, RULES)
    with Faults(faulty, lost=1.0, operations={lost}) as faults:
        first = allocator.allocate(PROJECT, strategy="atomic", attributes={"call": 1})
        second = allocator.allocate(PROJECT, strategy="atomic", attributes={"call": 2})
    assert faults.stats[lost].lost >= 2
    assert (first.numbers, second.numbers) == ((1,), (2,))
    assert truth(PROJECT)["lastIssue"] == 2  # type: ignore[index]
    member = {"PK": PROJECT["PK"], "SK": "ISSUE#0000000002"}
    assert truth(member)["call"] == 2  # type: ignore[index]
