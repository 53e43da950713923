"""The writers on children found through an index (rules with ``through``), on DynamoDB Local.

Follow edges are keyed by the follower (``PK = USER#<follower>, SK = FOLLOWS#<followee>``)
and name the followee in ``GSI1PK``, counted while ``GSI1SK`` starts ``FOLLOWING#``; cart
lines (``CART#<id>/LINE#<n>``) name their product in ``GSI2PK`` and are summed into its total.
Child and counter sit in different item collections; each write is one transaction.
"""

from __future__ import annotations

import contextlib
import os
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tally.local.dynamodb_local import local_client_kwargs
from tally.local.template import create_table_from, rules_table_kwargs
from tally.rules import CountRule, RuleSet, SumRule, parse_rules
from tally.writers import (
    IdempotencyConflictError,
    InvalidCounterError,
    InvalidRequestError,
    ParentNotFoundError,
    TallyWriter,
    WriteResult,
)
from tests.harness.faults import Faults
from tests.harness.index_tables import CART_TOTALS, gsi
from tests.harness.index_tables import FOLLOWERS as FOLLOWERS_RULE
from tests.utils import deserialize, serialize

RULES: RuleSet = parse_rules(
    {
        "rules": [
            FOLLOWERS_RULE | {"revision": "rev", "repair": "auto"},
            {
                "name": "product-totals",
                "kind": "sum",
                "parent": {"PK": "PRODUCT#*", "SK": "TOTAL"},
                "children": {"PK": "CART#*", "SK": "LINE#*"},
                "counter": "quantity",
                "summed": "units",
                "revision": "rev",
                "through": {"index": "GSI2", "partition_key": "GSI2PK", "sort_key": "GSI2SK"},
            },
            CART_TOTALS,
            {
                "name": "likes",
                "kind": "count",
                "parent": {"PK": "POST#*", "SK": "META"},
                "children": {"SK": "LIKE#*"},
                "counter": "likeCount",
            },
        ]
    }
)
FOLLOWERS = RULES["followers"]
TOTALS, CARTS = RULES["product-totals"], RULES["cart-totals"]
assert isinstance(FOLLOWERS, CountRule)
assert isinstance(TOTALS, SumRule) and isinstance(CARTS, SumRule)
FOLLOWING = "FOLLOWING#2026-11-26"


@pytest.fixture
def table(dynamodb: Any) -> Iterator[str]:
    """A table with the rules' keys and their inverted indexes (GSI1, GSI2, and Inverted
    over the table's own keys)."""
    name = f"tally-indexed-{uuid.uuid4().hex[:12]}"
    kwargs = rules_table_kwargs(RULES, name)
    # The indexes by hand, whether or not rules_table_kwargs builds the rules' own.
    defined = {d["AttributeName"]: d for d in kwargs["AttributeDefinitions"]}
    for attribute in ("GSI1PK", "GSI1SK", "GSI2PK", "GSI2SK"):
        defined.setdefault(attribute, {"AttributeName": attribute, "AttributeType": "S"})
    kwargs["AttributeDefinitions"] = list(defined.values())
    kwargs["GlobalSecondaryIndexes"] = [
        gsi("GSI1", "GSI1PK", "GSI1SK", "ALL"),
        gsi("GSI2", "GSI2PK", "GSI2SK", "ALL"),
        gsi("Inverted", "SK", "PK", "INCLUDE", "qty"),
    ]
    create_table_from(dynamodb, kwargs, None)
    yield name
    with contextlib.suppress(dynamodb.exceptions.ResourceNotFoundException):
        dynamodb.delete_table(TableName=name)


@pytest.fixture
def writer(dynamodb: Any, table: str) -> TallyWriter:
    return TallyWriter(dynamodb, table, RULES)


def user(name: str) -> dict[str, str]:
    return {"PK": f"USER#{name}", "SK": "PROFILE"}


def edge(follower: str, followee: str) -> dict[str, str]:
    return {"PK": f"USER#{follower}", "SK": f"FOLLOWS#{followee}"}


def follows(followee: str, status: str = FOLLOWING) -> dict[str, str]:
    return {"GSI1PK": f"USER#{followee}", "GSI1SK": status}


def put(dynamodb: Any, table: str, item: dict[str, Any]) -> None:
    dynamodb.put_item(TableName=table, Item=serialize(item))


def read(dynamodb: Any, table: str, key: dict[str, str]) -> dict[str, Any] | None:
    response = dynamodb.get_item(TableName=table, Key=serialize(key), ConsistentRead=True)
    return deserialize(response["Item"]) if "Item" in response else None


def scan(dynamodb: Any, table: str) -> list[dict[str, Any]]:
    pages = dynamodb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    return [deserialize(item) for page in pages for item in page["Items"]]


def counted(dynamodb: Any, table: str, rule: CountRule | SumRule) -> Counter[str]:
    """Each parent's count (or sum) of the children the base table holds, by scan."""
    totals: Counter[str] = Counter()
    for item in scan(dynamodb, table):
        matches = RULES.classify(RULES.key_of(item))
        if not any(m.rule is rule and m.role == "indexed" for m in matches):
            continue
        parent = rule.indexed_parent(item, RULES.table)
        if parent is not None:
            amount = item[rule.summed] if isinstance(rule, SumRule) else 1
            totals[parent["PK"]] += amount
    return totals


def counter(dynamodb: Any, table: str, key: dict[str, str], name: str) -> Any:
    item = read(dynamodb, table, key)
    assert item is not None
    return item.get(name)


def in_threads(work: Callable[[int], Any], threads: int) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(work, range(threads)))


# --- follow, unfollow, re-parent, status -------------------------------------------------


def test_follow_unfollow_and_follow_again_count_on_the_followee(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    for name in ("ann", "bob"):
        put(dynamodb, table, {**user(name), "followerCount": 0})
    ann_bob = edge("ann", "bob")

    assert writer.add_child(ann_bob, follows("bob")).outcome == "created"
    assert read(dynamodb, table, ann_bob) == {**ann_bob, **follows("bob")}
    assert counter(dynamodb, table, user("bob"), "followerCount") == 1
    assert counter(dynamodb, table, user("ann"), "followerCount") == 0  # not the key's PK
    assert writer.add_child(ann_bob, follows("bob")).outcome == "already_present"
    assert counter(dynamodb, table, user("bob"), "followerCount") == 1

    assert writer.remove_child(ann_bob).outcome == "removed"
    assert read(dynamodb, table, ann_bob) is None
    assert writer.remove_child(ann_bob).outcome == "not_present"
    assert counter(dynamodb, table, user("bob"), "followerCount") == 0

    assert writer.add_child(ann_bob, follows("bob")).outcome == "created"
    bob = read(dynamodb, table, user("bob"))
    assert bob == {**user("bob"), "followerCount": 1, "rev": 3}
    assert counted(dynamodb, table, FOLLOWERS) == Counter({"USER#bob": 1})


def test_a_re_parented_edge_moves_its_count_in_one_transaction(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    for name in ("bob", "cat"):
        put(dynamodb, table, {**user(name), "followerCount": 5, "rev": 0})
    ann = edge("ann", "x")
    writer.add_child(ann, follows("bob"))

    assert writer.move_child(ann, {"GSI1PK": "USER#cat"}) == WriteResult("changed")
    assert read(dynamodb, table, ann) == {**ann, **follows("cat")}
    assert read(dynamodb, table, user("bob")) == {**user("bob"), "followerCount": 5, "rev": 2}
    assert read(dynamodb, table, user("cat")) == {**user("cat"), "followerCount": 6, "rev": 1}
    assert writer.move_child(ann, {"GSI1PK": "USER#cat"}).outcome == "unchanged"
    # A new date within the counted status: the edge changes, no counter does.
    assert writer.move_child(ann, {"GSI1SK": "FOLLOWING#2027"}).outcome == "changed"
    assert counter(dynamodb, table, user("cat"), "rev") == 1
    # Removing it now decrements the parent its stored item names.
    assert writer.remove_child(ann).outcome == "removed"
    assert counter(dynamodb, table, user("cat"), "followerCount") == 5
    assert counter(dynamodb, table, user("bob"), "followerCount") == 5


def test_an_edge_leaving_and_re_entering_the_counted_status_is_uncounted_and_counted(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    put(dynamodb, table, {**user("bob"), "followerCount": 0})
    ann = edge("ann", "bob")
    writer.add_child(ann, follows("bob"))

    assert writer.move_child(ann, {"GSI1SK": "MUTED#1"}).outcome == "changed"
    assert read(dynamodb, table, ann) == {**ann, **follows("bob", "MUTED#1")}
    assert counter(dynamodb, table, user("bob"), "followerCount") == 0
    assert writer.move_child(ann, {"GSI1SK": "BLOCKED#2"}).outcome == "changed"  # neither side
    assert counter(dynamodb, table, user("bob"), "rev") == 2
    assert writer.move_child(ann, {"GSI1SK": FOLLOWING}).outcome == "changed"
    assert counter(dynamodb, table, user("bob"), "followerCount") == 1
    # Out of the sparse index: no index key, no child.
    assert writer.move_child(ann, {"GSI1PK": None, "GSI1SK": None}).outcome == "changed"
    assert read(dynamodb, table, ann) == ann
    assert counter(dynamodb, table, user("bob"), "followerCount") == 0
    assert writer.move_child(ann, follows("bob")).outcome == "changed"
    assert counter(dynamodb, table, user("bob"), "followerCount") == 1
    # An edge outside the count is removed without touching a counter.
    writer.move_child(ann, {"GSI1SK": "MUTED#3"})
    assert writer.remove_child(ann).outcome == "removed"
    assert read(dynamodb, table, user("bob")) == {**user("bob"), "followerCount": 0, "rev": 6}


def test_a_sum_through_an_index_moves_the_amount_with_the_line(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    for sku in ("a", "b"):
        put(dynamodb, table, {"PK": f"PRODUCT#{sku}", "SK": "TOTAL", "quantity": 0})
    line = {"PK": "CART#1", "SK": "LINE#1"}
    product = {"GSI2PK": "PRODUCT#a", "GSI2SK": "CART#1"}
    total_a, total_b = {"PK": "PRODUCT#a", "SK": "TOTAL"}, {"PK": "PRODUCT#b", "SK": "TOTAL"}

    assert writer.add_child(line, {**product, "units": Decimal("2.5")}).outcome == "created"
    assert counter(dynamodb, table, total_a, "quantity") == Decimal("2.5")
    assert writer.change_amount(line, 4).outcome == "changed"
    assert counter(dynamodb, table, total_a, "quantity") == 4
    assert writer.move_child(line, {"GSI2PK": "PRODUCT#b"}).outcome == "changed"
    assert counter(dynamodb, table, total_a, "quantity") == 0
    assert counter(dynamodb, table, total_b, "quantity") == 4
    assert writer.remove_child(line).outcome == "removed"
    assert counter(dynamodb, table, total_b, "quantity") == 0
    assert counted(dynamodb, table, TOTALS) == Counter()


def test_cart_lines_named_by_their_own_sort_key_are_summed_into_the_product_across_carts(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    sku = {"PK": "SKU#a", "SK": "ALLCARTS"}
    put(dynamodb, table, {**sku, "cartQuantity": 0})
    lines = [{"PK": f"BASKET#{n}", "SK": "SKU#a"} for n in range(3)]
    for n, line in enumerate(lines, start=1):
        assert writer.add_child(line, {"qty": n}).outcome == "created"
    assert counter(dynamodb, table, sku, "cartQuantity") == 6
    assert writer.change_amount(lines[0], 5).outcome == "changed"
    assert writer.remove_child(lines[1]).outcome == "removed"
    assert counter(dynamodb, table, sku, "cartQuantity") == 8
    assert counted(dynamodb, table, CARTS) == Counter({"SKU#a": 8})
    with pytest.raises(InvalidRequestError) as refused:
        writer.move_child(lines[0], {"SK": "SKU#b"})
    assert refused.value.field == ("attributes", "SK")
    with pytest.raises(ParentNotFoundError):
        writer.add_child({"PK": "BASKET#1", "SK": "SKU#zzz"}, {"qty": 1})


@pytest.mark.parametrize("old_followee_deleted", [False, True])
def test_a_re_parent_between_the_read_and_the_write_cannot_decrement_the_old_parent(
    dynamodb: Any, table: str, writer: TallyWriter, old_followee_deleted: bool
) -> None:
    for name in ("bob", "cat"):
        put(dynamodb, table, {**user(name), "followerCount": 0})
    ann = edge("ann", "x")
    writer.add_child(ann, follows("bob"))
    other = TallyWriter(dynamodb, table, RULES)
    real_get = writer._get
    raced: list[bool] = []

    def stale_read(key: dict[str, str]) -> dict[str, Any] | None:
        item = real_get(key)
        if key == ann and not raced:  # another writer re-parents the edge after our read
            raced.append(True)
            other.move_child(ann, {"GSI1PK": "USER#cat"})
            if old_followee_deleted:  # and bob's profile goes: the stale parent is missing
                dynamodb.delete_item(TableName=table, Key=serialize(user("bob")))
        return item

    writer._get = stale_read  # type: ignore[method-assign]
    result = writer.remove_child(ann)
    assert (result.outcome, result.attempts) == ("removed", 2)
    if not old_followee_deleted:
        assert counter(dynamodb, table, user("bob"), "followerCount") == 0
    assert counter(dynamodb, table, user("cat"), "followerCount") == 0
    assert counted(dynamodb, table, FOLLOWERS) == Counter()


def test_an_idempotency_key_answers_a_move_once_and_a_move_undone_is_superseded(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    for name in ("bob", "cat"):
        put(dynamodb, table, {**user(name), "followerCount": 0})
    ann = edge("ann", "x")
    writer.add_child(ann, follows("bob"), idempotency_key="follow-1")
    assert writer.add_child(ann, follows("bob"), idempotency_key="follow-1") == WriteResult(
        "created", replayed=True
    )
    move = {"GSI1PK": "USER#cat"}
    assert writer.move_child(ann, move, idempotency_key="move-1").outcome == "changed"
    again = writer.move_child(ann, move, idempotency_key="move-1")
    assert again == WriteResult("changed", replayed=True)
    assert counter(dynamodb, table, user("cat"), "followerCount") == 1
    writer.move_child(ann, {"GSI1PK": "USER#bob"})
    with pytest.raises(IdempotencyConflictError) as conflict:
        writer.move_child(ann, move, idempotency_key="move-1")
    assert conflict.value.reason == "superseded"
    assert counted(dynamodb, table, FOLLOWERS) == Counter({"USER#bob": 1})


# --- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attributes", "field"),
    [
        ({}, ("attributes", "GSI1PK")),
        ({"GSI1SK": FOLLOWING}, ("attributes", "GSI1PK")),
        ({"GSI1PK": "USER#bob"}, ("attributes", "GSI1SK")),
        ({"GSI1PK": "USER#bob", "GSI1SK": "MUTED#1"}, ("attributes", "GSI1SK")),
        ({"GSI1PK": "TEAM#bob", "GSI1SK": FOLLOWING}, ("attributes", "GSI1PK")),
        ({"GSI1PK": Decimal(7), "GSI1SK": FOLLOWING}, ("attributes", "GSI1PK")),
        ({"GSI1PK": "USER#" + "b" * 2048, "GSI1SK": FOLLOWING}, ("attributes", "GSI1PK")),
        ({**follows("bob"), "followerCount": 1}, ("attributes", "followerCount")),
    ],
)
def test_an_edge_that_names_no_followee_is_refused_by_field_and_nothing_is_written(
    dynamodb: Any, table: str, writer: TallyWriter, attributes: dict[str, Any], field: Any
) -> None:
    put(dynamodb, table, {**user("bob"), "followerCount": 0})
    before = scan(dynamodb, table)
    with pytest.raises(InvalidRequestError) as refused:
        writer.add_child(edge("ann", "bob"), attributes)
    assert refused.value.field == field
    assert scan(dynamodb, table) == before


@pytest.mark.parametrize(
    ("key", "attributes", "field"),
    [
        (edge("ann", "x"), {"GSI1PK": "TEAM#x"}, ("attributes", "GSI1PK")),
        (edge("ann", "x"), {"GSI1PK": ""}, ("attributes", "GSI1PK")),
        (edge("ann", "x"), {"nickname": "b"}, ("attributes", "nickname")),
        (edge("ann", "x"), {"SK": "FOLLOWS#y"}, ("attributes", "SK")),
        (edge("ann", "x"), {}, ("attributes",)),
        ({"PK": "POST#1", "SK": "LIKE#ann"}, {"GSI1PK": "USER#bob"}, ("key",)),
        ({"PK": "CART#1", "SK": "LINE#1"}, {"GSI2SK": ""}, ("attributes", "GSI2SK")),
        ({"PK": "CART#1", "SK": "LINE#1"}, {"GSI2SK": True}, ("attributes", "GSI2SK")),
    ],
)
def test_a_move_the_rules_or_the_index_refuse_names_the_field_and_writes_nothing(
    dynamodb: Any,
    table: str,
    writer: TallyWriter,
    key: dict[str, str],
    attributes: dict[str, Any],
    field: Any,
) -> None:
    put(dynamodb, table, {**user("bob"), "followerCount": 0})
    put(dynamodb, table, {"PK": "PRODUCT#a", "SK": "TOTAL", "quantity": 0})
    writer.add_child(edge("ann", "x"), follows("bob"))
    line = {"GSI2PK": "PRODUCT#a", "GSI2SK": "CART#1", "units": 1}
    writer.add_child({"PK": "CART#1", "SK": "LINE#1"}, line)
    before = scan(dynamodb, table)
    with pytest.raises(InvalidRequestError) as refused:
        writer.move_child(key, attributes)
    assert refused.value.field == field
    assert scan(dynamodb, table) == before


def test_a_sum_line_whose_index_key_the_index_refuses_is_named_and_nothing_is_written(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    put(dynamodb, table, {"PK": "PRODUCT#a", "SK": "TOTAL", "quantity": 0})
    before = scan(dynamodb, table)
    for bad in ("", Decimal(5)):
        with pytest.raises(InvalidRequestError) as refused:
            line = {"GSI2PK": "PRODUCT#a", "GSI2SK": bad, "units": 1}
            writer.add_child({"PK": "CART#1", "SK": "LINE#1"}, line)
        assert refused.value.field == ("attributes", "GSI2SK")
    assert scan(dynamodb, table) == before


@pytest.mark.parametrize("units", ["1E+40", "-1E+40", "9" * 38, "1E-100", "0.001"])
@pytest.mark.parametrize("operation", ["remove", "change", "move"])
def test_a_line_whose_stored_amount_no_writer_stores_is_refused_naming_it(
    dynamodb: Any, table: str, writer: TallyWriter, operation: str, units: str
) -> None:
    """A line another writer stored outside the rule's amount domain (DynamoDB returns 1E+40
    as 41 digits) is neither removed, changed nor moved: InvalidCounterError names its amount,
    and nothing is written."""
    for sku in ("a", "b"):
        put(dynamodb, table, {"PK": f"PRODUCT#{sku}", "SK": "TOTAL", "quantity": 0})
    line = {"PK": "CART#1", "SK": "LINE#1"}
    stored = {"GSI2PK": "PRODUCT#a", "GSI2SK": "CART#1", "units": Decimal(units)}
    put(dynamodb, table, {**line, **stored})
    before = scan(dynamodb, table)
    calls = {
        "remove": lambda: writer.remove_child(line),
        "change": lambda: writer.change_amount(line, 4),
        "move": lambda: writer.move_child(line, {"GSI2PK": "PRODUCT#b"}),
    }
    with pytest.raises(InvalidCounterError) as refused:
        calls[operation]()
    assert (refused.value.attribute, refused.value.key) == ("units", line)
    assert scan(dynamodb, table) == before


def test_a_missing_followee_is_parent_not_found_for_a_follow_and_a_re_parent(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    put(dynamodb, table, {**user("bob"), "followerCount": 0})
    before = scan(dynamodb, table)
    with pytest.raises(ParentNotFoundError) as missing:
        writer.add_child(edge("ann", "x"), follows("nobody"))
    assert missing.value.key == user("nobody")
    assert scan(dynamodb, table) == before
    writer.add_child(edge("ann", "x"), follows("bob"))
    before = scan(dynamodb, table)
    with pytest.raises(ParentNotFoundError) as missing:
        writer.move_child(edge("ann", "x"), {"GSI1PK": "USER#nobody"})
    assert missing.value.key == user("nobody")
    assert scan(dynamodb, table) == before


# --- threads and lost responses ----------------------------------------------------------

FOLLOWEES = ["bob", "cat", "dan"]
CALLS = int(os.environ.get("TALLY_FAULT_CALLS", "40"))  # raise it for a long run


def test_threads_following_unfollowing_and_re_parenting_keep_every_followee_exact(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    for name in FOLLOWEES:
        put(dynamodb, table, {**user(name), "followerCount": 0, "rev": 0})

    def session(thread: int) -> Counter[str]:
        rng = random.Random(thread)
        outcomes: Counter[str] = Counter()
        for _ in range(30):
            key = edge(f"u{rng.randrange(6)}", f"e{rng.randrange(2)}")  # shared by threads
            step = rng.random()
            if step < 0.4:
                result = writer.add_child(key, follows(rng.choice(FOLLOWEES)))
            elif step < 0.65:
                result = writer.remove_child(key)
            elif step < 0.85:
                result = writer.move_child(key, {"GSI1PK": f"USER#{rng.choice(FOLLOWEES)}"})
            else:
                status = rng.choice([FOLLOWING, "MUTED#1"])
                result = writer.move_child(key, {"GSI1SK": status})
            outcomes[result.outcome] += 1
        return outcomes

    totals = sum(in_threads(session, 8), Counter())
    assert totals["created"] and totals["removed"] and totals["changed"]
    truth = counted(dynamodb, table, FOLLOWERS)
    for name in FOLLOWEES:
        assert counter(dynamodb, table, user(name), "followerCount") == truth[f"USER#{name}"]


def test_threads_adding_changing_and_moving_cart_lines_keep_every_product_total_exact(
    dynamodb: Any, table: str, writer: TallyWriter
) -> None:
    products = ["PRODUCT#a", "PRODUCT#b"]
    for product in products:
        put(dynamodb, table, {"PK": product, "SK": "TOTAL", "quantity": 0, "rev": 0})

    def session(thread: int) -> Counter[str]:
        rng = random.Random(f"cart-{thread}")
        outcomes: Counter[str] = Counter()
        for _ in range(25):
            line = {"PK": f"CART#{rng.randrange(3)}", "SK": f"LINE#{rng.randrange(2)}"}
            step = rng.random()
            units = Decimal(rng.randrange(1, 500)) / 100
            if step < 0.35:
                index = {"GSI2PK": rng.choice(products), "GSI2SK": line["PK"]}
                result = writer.add_child(line, {**index, "units": units})
            elif step < 0.6:
                result = writer.change_amount(line, units)
            elif step < 0.85:
                result = writer.move_child(line, {"GSI2PK": rng.choice(products)})
            else:
                result = writer.remove_child(line)
            outcomes[result.outcome] += 1
        return outcomes

    totals = sum(in_threads(session, 8), Counter())
    assert totals["created"] and totals["changed"] and totals["removed"]
    truth = counted(dynamodb, table, TOTALS)
    for product in products:
        total = counter(dynamodb, table, {"PK": product, "SK": "TOTAL"}, "quantity")
        assert total == truth[product]


def test_follows_with_lost_responses_count_each_edge_once(
    dynamodb: Any, dynamodb_endpoint: str, table: str
) -> None:
    for name in FOLLOWEES:
        put(dynamodb, table, {**user(name), "followerCount": 0, "rev": 0})
    config = Config(retries={"mode": "standard", "max_attempts": 5})
    faulty = boto3.client("dynamodb", config=config, **local_client_kwargs(dynamodb_endpoint))
    writer = TallyWriter(faulty, table, RULES)
    rng = random.Random("indexed")
    differing: list[str] = []
    with Faults(faulty, lost=0.3, seed=5) as faults:
        for step in range(CALLS):
            key = edge(f"u{rng.randrange(3)}", "x")
            parents = {name: read(dynamodb, table, user(name)) for name in FOLLOWEES}
            before = read(dynamodb, table, key)
            idempotency_key = f"k{step}" if step % 3 == 0 else None
            choice = rng.random()
            if choice < 0.4:
                result = writer.add_child(
                    key, follows(rng.choice(FOLLOWEES)), idempotency_key=idempotency_key
                )
            elif choice < 0.7:
                result = writer.remove_child(key, idempotency_key=idempotency_key)
            else:
                move = {"GSI1PK": f"USER#{rng.choice(FOLLOWEES)}"}
                result = writer.move_child(key, move, idempotency_key=idempotency_key)
            after = read(dynamodb, table, key)
            moved = {
                name: counter(dynamodb, table, user(name), "followerCount")
                - parents[name]["followerCount"]  # type: ignore[index]
                for name in FOLLOWEES
            }
            if moved != _expected_moves(result.outcome, before, after):
                differing.append(f"step {step}: {result} {before} -> {after}: {moved}")
    lost = faults.total().lost
    print(f"\n[faults] indexed edges: calls={CALLS} lost={lost} differing={len(differing)}")
    assert lost > 0, "the harness lost no response: the run proves nothing"
    assert differing == []
    truth = counted(dynamodb, table, FOLLOWERS)
    for name in FOLLOWEES:
        assert counter(dynamodb, table, user(name), "followerCount") == truth[f"USER#{name}"]


def _expected_moves(
    outcome: str, before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, int]:
    """Each followee's change the outcome implies, from the edge before and after."""
    moves = dict.fromkeys(FOLLOWEES, 0)
    consistent = {
        "created": before is None and after is not None,
        "removed": before is not None and after is None,
        "changed": before is not None and after is not None and before != after,
        "already_present": before is not None and after == before,
        "not_present": before is None and after is None,
        "unchanged": before is not None and after == before,
    }
    if not consistent[outcome]:
        return {"inconsistent": 1}
    if outcome in ("created", "removed", "changed"):
        for image, sign in ((before, -1), (after, 1)):
            parent = FOLLOWERS.indexed_parent(image or {}, RULES.table)
            if parent is not None:
                moves[parent["PK"].removeprefix("USER#")] += sign
    return moves
