"""The reconciler's reads and groups on other key schemas: number sort keys, partitions keyed
by their number (moto for the table, stream records as Lambda shapes them)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import boto3
import pytest
from moto import mock_aws

from tally.core.dynamodb import deserialize, serialize
from tally.local.template import create_table_from, rules_table_kwargs
from tally.reconciler.stream.grouping import group_records
from tally.reconciler.table.tally_table import TallyTable
from tally.rules import RuleSet, SequenceRule, parse_rules
from tally.rules.live_table import TableShape
from tests.utils import stream_record

PROJECTS = parse_rules(
    {
        "table": {"partition_key": "pk", "sort_key": "sk", "sort_key_type": "N"},
        "rules": [
            {
                "name": "issues",
                "kind": "sequence",
                "parent": {"pk": "*", "sk": "0"},
                "counter": "lastIssue",
                "members": {"layout": "collection", "sk": "*"},
            },
        ],
    }
)
COMMENTS = parse_rules(
    {
        "table": {"partition_key": "pk", "sort_key": "sk", "sort_key_type": "N"},
        "rules": [
            {
                "name": "comments",
                "kind": "count",
                "parent": {"pk": "*", "sk": "-1"},
                "children": {"sk": "*"},
                "counter": "n",
            }
        ],
    }
)
ORDERS = parse_rules(
    {
        "table": {"partition_key": "pk"},
        "rules": [
            {
                "name": "order-ids",
                "kind": "sequence",
                "parent": {"pk": "orderCounter"},
                "counter": "count",
                "members": {"layout": "partition", "pk": "*", "width": 1},
            }
        ],
    }
)


@pytest.fixture
def ddb() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("dynamodb")
        log = {
            "TableName": "log",
            "AttributeDefinitions": [{"AttributeName": "PK", "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": "PK", "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST",
        }
        create_table_from(client, log, None)
        yield client


def table_for(ddb: Any, rules: RuleSet, name: str) -> TallyTable:
    create_table_from(ddb, rules_table_kwargs(rules, name), None)
    return TallyTable(ddb, name, rules)


def put(ddb: Any, table: str, **item: Any) -> None:
    ddb.put_item(TableName=table, Item=serialize(item))


def log_put(repair_id: str) -> dict[str, Any]:
    return {"Put": {"TableName": "log", "Item": serialize({"PK": repair_id})}}


def sequence(rules: RuleSet, name: str) -> SequenceRule:
    rule = rules[name]
    assert isinstance(rule, SequenceRule)
    return rule


# --- tables from the rules' key schema ----------------------------------------------------


def test_the_rules_key_schema_makes_a_table_with_a_stream(ddb: Any) -> None:
    create_table_from(ddb, rules_table_kwargs(PROJECTS, "projects"), None)
    shape = TableShape.of(ddb.describe_table(TableName="projects")["Table"])
    assert shape.keys == PROJECTS.table
    assert shape.stream_view == "NEW_AND_OLD_IMAGES"


# --- stream records with number keys ------------------------------------------------------


def test_number_sort_keys_group_under_their_project() -> None:
    issue = stream_record("INSERT", {"pk": "p1", "sk": Decimal(3)}, {"priority": "low"})
    counter = stream_record(
        "MODIFY", {"pk": "p1", "sk": Decimal(0)}, {"lastIssue": 3}, {"lastIssue": 2}
    )
    batch = group_records([issue, counter], PROJECTS)
    [group] = batch.groups.values()
    assert group.parent_key == {"pk": "p1", "sk": "0"}
    assert group.inserted == {3: 1} and group.handed_out == [(3, 3)]
    assert group.balanced and not batch.malformed


def test_orders_keyed_by_number_group_under_the_counter() -> None:
    order = stream_record("INSERT", {"pk": "17"}, {"deliveryMethod": "expedited"})
    batch = group_records([order], ORDERS)
    [group] = batch.groups.values()
    assert group.parent_key == {"pk": "orderCounter"}
    assert group.inserted == {17: 1} and not group.balanced


# --- reads and repairs --------------------------------------------------------------------


def test_number_sort_key_members_are_read_by_a_numeric_range(ddb: Any) -> None:
    table = table_for(ddb, PROJECTS, "projects")
    put(ddb, "projects", pk="p1", sk=0, lastIssue=3)
    for n in (1, 2, 3, 10):
        put(ddb, "projects", pk="p1", sk=n)
    put(ddb, "projects", pk="p1", sk=Decimal("2.5"))
    found = table.members.member_numbers(sequence(PROJECTS, "issues"), {"pk": "p1", "sk": "0"}, 1)
    assert found == [
        (2, {"pk": "p1", "sk": "2"}),
        (3, {"pk": "p1", "sk": "3"}),
        (10, {"pk": "p1", "sk": "10"}),
    ]


def test_a_count_on_a_number_sort_key_counts_the_positive_numbers(ddb: Any) -> None:
    table = table_for(ddb, COMMENTS, "projects")
    put(ddb, "projects", pk="p1", sk=-1, n=2)
    for n in (Decimal(1), Decimal("2.5"), Decimal(7)):
        put(ddb, "projects", pk="p1", sk=n)
    put(ddb, "projects", pk="p2", sk=1)
    rule = COMMENTS["comments"]
    assert not isinstance(rule, SequenceRule)
    assert table.parents.tally_children(rule, {"pk": "p1", "sk": "-1"}).actual == 3


def test_a_void_on_a_number_sort_key_is_a_number(ddb: Any) -> None:
    table = table_for(ddb, PROJECTS, "projects")
    put(ddb, "projects", pk="p1", sk=0, lastIssue=4)
    counter = {"pk": "p1", "sk": "0"}
    rule = sequence(PROJECTS, "issues")
    assert table.writes.put_void(rule, counter, 4, counter, "r1", [log_put("r1")]) == "written"
    item = ddb.get_item(TableName="projects", Key=serialize({"pk": "p1", "sk": 4}))["Item"]
    assert deserialize(item)["void"] is True


def test_a_void_needs_its_counter_item_holding_the_number_handed_out(ddb: Any) -> None:
    table = table_for(ddb, PROJECTS, "projects")
    counter = {"pk": "p1", "sk": "0"}
    rule = sequence(PROJECTS, "issues")
    assert table.writes.put_void(rule, counter, 2, counter, "r1", [log_put("r1")]) == "gone"
    put(ddb, "projects", pk="p1", sk=0, lastIssue=1)  # a key reused: 2 not handed out yet
    assert table.writes.put_void(rule, counter, 2, counter, "r2", [log_put("r2")]) == "gone"
    assert "Item" not in ddb.get_item(TableName="projects", Key=serialize({"pk": "p1", "sk": 2}))


def test_partition_members_are_read_up_to_the_counter_and_on_while_found(ddb: Any) -> None:
    table = table_for(ddb, ORDERS, "orders")
    put(ddb, "orders", pk="orderCounter", count=5)
    for n in (1, 2, 4, 5, 6, 105, 350):
        put(ddb, "orders", pk=str(n), deliveryMethod="expedited")
    rule = sequence(ORDERS, "order-ids")
    numbers = [n for n, _ in table.members.member_numbers(rule, {"pk": "orderCounter"}, 0)]
    # 6 runs past the counter: 101-200 are read too, and hold 105; 201-300 hold none: stop.
    assert numbers == [1, 2, 4, 5, 6, 105]
    assert [n for n, _ in table.members.member_numbers(rule, {"pk": "orderCounter"}, 4)] == [
        5,
        6,
        105,
    ]


def test_a_void_in_a_partition_of_its_own(ddb: Any) -> None:
    table = table_for(ddb, ORDERS, "orders")
    rule = sequence(ORDERS, "order-ids")
    counter = {"pk": "orderCounter"}
    put(ddb, "orders", pk="orderCounter", count=5)
    assert table.writes.put_void(rule, counter, 3, counter, "r2", [log_put("r2")]) == "written"
    assert "Item" in ddb.get_item(TableName="orders", Key=serialize({"pk": "3"}))
    put(ddb, "orders", pk="4")
    assert table.writes.put_void(rule, counter, 4, counter, "r3", [log_put("r3")]) == "arrived"


# --- counter_holds = "next": numbers from 0, read and voided under their own keys ----------

NEXT_FREE = parse_rules(
    {
        "table": {"partition_key": "PK", "sort_key": "SK"},
        "rules": [
            {
                "name": "issues",
                "kind": "sequence",
                "parent": {"PK": "PROJECT#*", "SK": "COUNTER#ISSUE"},
                "counter": "lastIssue",
                "counter_holds": "next",
                "members": {"layout": "collection", "SK": "ISSUE#*", "width": 10},
            },
            {
                "name": "users",
                "kind": "sequence",
                "parent": {"PK": "UserMetadata", "SK": "META"},
                "counter": "LastID",
                "counter_holds": "next",
                "members": {
                    "layout": "index",
                    "key": {"PK": "User#*"},
                    "index": "SequenceIndex",
                    "sequence_attribute": "seqName",
                    "number": "NumIdentifier",
                },
            },
        ],
    }
)
NEXT_ON_A_NUMBER_KEY = parse_rules(
    {
        "table": {"partition_key": "pk", "sort_key": "sk", "sort_key_type": "N"},
        "rules": [
            {
                "name": "issues",
                "kind": "sequence",
                "parent": {"pk": "*", "sk": "0"},
                "counter": "lastIssue",
                "counter_holds": "next",
                "members": {"layout": "collection", "sk": "*"},
            },
        ],
    }
)


def test_next_free_collection_members_are_read_from_the_first_above_the_watermark(
    ddb: Any,
) -> None:
    """Watermark 0: member 0 (ordinal 1) is read; the key of ordinal 1 is ISSUE#...0."""
    table = table_for(ddb, NEXT_FREE, "issues")
    put(ddb, "issues", PK="PROJECT#A", SK="COUNTER#ISSUE", lastIssue=6)
    for n in (0, 1, 2, 3, 5):
        put(ddb, "issues", PK="PROJECT#A", SK=f"ISSUE#{n:010d}")
    rule, counter = sequence(NEXT_FREE, "issues"), {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
    found = table.members.member_numbers(rule, counter, 0)
    assert found == [(n + 1, {"PK": "PROJECT#A", "SK": f"ISSUE#{n:010d}"}) for n in (0, 1, 2, 3, 5)]
    assert [n for n, _ in table.members.member_numbers(rule, counter, 2)] == [3, 4, 6]
    assert table.writes.put_void(rule, counter, 5, counter, "r1", [log_put("r1")]) == "written"
    assert "Item" in ddb.get_item(
        TableName="issues", Key=serialize({"PK": "PROJECT#A", "SK": "ISSUE#0000000004"})
    )
    assert table.writes.put_void(rule, counter, 1, counter, "r2", [log_put("r2")]) == "arrived"


def test_next_free_index_members_hold_their_own_numbers_and_so_do_their_voids(ddb: Any) -> None:
    table = table_for(ddb, NEXT_FREE, "issues")
    counter = {"PK": "UserMetadata", "SK": "META"}
    put(ddb, "issues", **counter, LastID=6)
    for n in (0, 1, 2, 3):
        put(ddb, "issues", PK=f"User#u{n}", SK="PROFILE", seqName="users", NumIdentifier=n)
    rule = sequence(NEXT_FREE, "users")
    assert [n for n, _ in table.members.member_numbers(rule, counter, 0)] == [1, 2, 3, 4]
    assert [n for n, _ in table.members.member_numbers(rule, counter, 2)] == [3, 4]
    assert table.writes.put_void(rule, counter, 5, counter, "r1", [log_put("r1")]) == "written"
    void = {"PK": "User#VOID#users#0000000004", "SK": "VOID"}
    item = deserialize(ddb.get_item(TableName="issues", Key=serialize(void))["Item"])
    assert (item["NumIdentifier"], item["void"]) == (4, True)
    assert table.members.member_numbers(rule, counter, 4) == [(5, void)]
    assert table.members.member_numbers(rule, counter, 4, voids=False) == []


def test_next_free_on_a_number_sort_key_reads_from_the_first_above_the_watermark(
    ddb: Any,
) -> None:
    """Members of a number key are positive: the counter item at sk 0 is never member 0."""
    table = table_for(ddb, NEXT_ON_A_NUMBER_KEY, "projects")
    put(ddb, "projects", pk="p1", sk=0, lastIssue=3)
    for n in (1, 2):
        put(ddb, "projects", pk="p1", sk=n)
    rule, counter = sequence(NEXT_ON_A_NUMBER_KEY, "issues"), {"pk": "p1", "sk": "0"}
    assert [n for n, _ in table.members.member_numbers(rule, counter, 0)] == [2, 3]
    assert [n for n, _ in table.members.member_numbers(rule, counter, 1)] == [2, 3]
    assert [n for n, _ in table.members.member_numbers(rule, counter, 2)] == [3]
