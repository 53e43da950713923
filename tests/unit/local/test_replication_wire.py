"""What the emulator's fronts do to DynamoDB's JSON: every write to a replicated table carries
the hidden stamp, nothing else changes, and nothing that leaves shows it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.local.replication.wire import (
    HIDDEN,
    HIDDEN_ORIGIN,
    HIDDEN_STAMP,
    Refused,
    WireStamp,
    hides_tables,
    stamp_of,
    stamp_request,
    tombstones_of,
    transaction_touches,
    visible_records,
    wire_key,
    without_hidden,
)

STAMP = WireStamp(1_700_000_000_000_000, "eu-west-1")
KEY = {"PK": {"S": "POST#1"}, "SK": {"S": "META"}}
REPLICATED = ["tally"]


def test_a_put_to_a_replicated_table_carries_the_stamp_and_nothing_else_changes() -> None:
    body = {"TableName": "tally", "Item": {**KEY, "likes": {"N": "1"}}}
    stamped = stamp_request("PutItem", body, STAMP, REPLICATED).body
    assert stamp_of(stamped["Item"]) == STAMP
    assert without_hidden(stamped) == body
    assert body == {"TableName": "tally", "Item": {**KEY, "likes": {"N": "1"}}}  # not mutated


def test_a_write_to_another_table_is_sent_as_it_came() -> None:
    body = {"TableName": "audit", "Item": KEY}
    assert stamp_request("PutItem", body, STAMP, REPLICATED).body == body


@pytest.mark.parametrize(
    ("expression", "stamped"),
    [
        ("ADD likes :one", "SET #__gt_ts = :__gt_ts, #__gt_origin = :__gt_origin ADD likes :one"),
        (
            "SET a = :a REMOVE b",
            "SET #__gt_ts = :__gt_ts, #__gt_origin = :__gt_origin, a = :a REMOVE b",
        ),
        (
            "REMOVE b set a = :a",
            "REMOVE b SET #__gt_ts = :__gt_ts, #__gt_origin = :__gt_origin, a = :a",
        ),
        # A placeholder or a path that holds the letters "set" is not the clause.
        (
            "ADD #set :set",
            "SET #__gt_ts = :__gt_ts, #__gt_origin = :__gt_origin ADD #set :set",
        ),
    ],
)
def test_an_update_sets_the_stamp_in_its_own_set_clause(expression: str, stamped: str) -> None:
    body = {"TableName": "tally", "Key": KEY, "UpdateExpression": expression}
    out = stamp_request("UpdateItem", body, STAMP, REPLICATED).body
    assert out["UpdateExpression"] == stamped
    assert out["ExpressionAttributeNames"] == {
        "#__gt_ts": HIDDEN_STAMP,
        "#__gt_origin": HIDDEN_ORIGIN,
    }
    assert out["ExpressionAttributeValues"][":__gt_ts"] == {"N": str(STAMP.at)}


def test_a_legacy_update_gets_the_stamp_as_attribute_updates() -> None:
    body = {"TableName": "tally", "Key": KEY, "AttributeUpdates": {"n": {"Action": "ADD"}}}
    out = stamp_request("UpdateItem", body, STAMP, REPLICATED).body
    assert "UpdateExpression" not in out
    assert out["AttributeUpdates"][HIDDEN_STAMP] == {"Action": "PUT", "Value": {"N": str(STAMP.at)}}


def test_a_deletion_outside_a_transaction_is_named_for_its_tombstone() -> None:
    stamped = stamp_request("DeleteItem", {"TableName": "tally", "Key": KEY}, STAMP, REPLICATED)
    [deletion] = stamped.deletions
    assert (deletion.table, deletion.key) == ("tally", wire_key(KEY))


def test_a_transactions_deletion_writes_its_tombstone_in_the_same_transaction() -> None:
    body = {
        "TransactItems": [
            {"Delete": {"TableName": "tally", "Key": KEY}},
            {"Put": {"TableName": "tally", "Item": {"PK": {"S": "x"}, "SK": {"S": "y"}}}},
            {"ConditionCheck": {"TableName": "audit", "Key": KEY, "ConditionExpression": "a"}},
        ]
    }
    out = stamp_request("TransactWriteItems", body, STAMP, REPLICATED)
    assert out.deletions == ()
    actions = out.body["TransactItems"]
    assert actions[3] == {
        "Put": {"TableName": tombstones_of("tally"), "Item": {**KEY, **STAMP.attributes()}}
    }
    assert stamp_of(actions[1]["Put"]["Item"]) == STAMP
    assert actions[2] == body["TransactItems"][2]


def test_a_batch_stamps_its_puts_and_names_its_deletions() -> None:
    body = {
        "RequestItems": {
            "tally": [{"PutRequest": {"Item": KEY}}, {"DeleteRequest": {"Key": KEY}}],
            "audit": [{"DeleteRequest": {"Key": KEY}}],
        }
    }
    out = stamp_request("BatchWriteItem", body, STAMP, REPLICATED)
    assert stamp_of(out.body["RequestItems"]["tally"][0]["PutRequest"]["Item"]) == STAMP
    assert [(d.table, d.key) for d in out.deletions] == [("tally", wire_key(KEY))]


def test_a_partiql_write_to_a_replicated_table_is_refused_a_read_is_not() -> None:
    with pytest.raises(Refused, match="PartiQL write") as refused:
        stamp_request(
            "ExecuteStatement", {"Statement": 'UPDATE "tally" SET a=1'}, STAMP, REPLICATED
        )
    assert refused.value.code == "ValidationException"
    read = {"Statement": 'SELECT * FROM "tally"'}
    assert stamp_request("ExecuteStatement", read, STAMP, REPLICATED).body == read


def test_a_regions_stream_shows_no_stamp_and_names_the_reader() -> None:
    new = {**KEY, "n": {"N": "2"}, **WireStamp(2, "us-east-1").attributes()}
    old = {**KEY, "n": {"N": "2"}, **WireStamp(1, "eu-west-1").attributes()}
    replicated = {
        "eventName": "MODIFY",
        "awsRegion": "ddblocal",
        "dynamodb": {"NewImage": new, "OldImage": old},
    }
    [shown] = visible_records([replicated], "eu-west-1")
    assert shown["awsRegion"] == "eu-west-1"
    assert (
        shown["dynamodb"]["NewImage"] == shown["dynamodb"]["OldImage"] == {**KEY, "n": {"N": "2"}}
    )
    # The same values written by the reading Region itself: a write that changed nothing.
    assert visible_records([replicated], "us-east-1") == []


def test_the_side_tables_are_not_listed() -> None:
    assert hides_tables(["tally", tombstones_of("tally"), "audit"]) == ["tally", "audit"]


attribute = st.recursive(
    st.one_of(
        st.builds(lambda s: {"S": s}, st.text(max_size=5)),
        st.builds(lambda n: {"N": str(n)}, st.integers()),
    ),
    lambda inner: st.one_of(
        st.builds(lambda m: {"M": m}, st.dictionaries(st.text(max_size=4), inner, max_size=3)),
        st.builds(lambda items: {"L": items}, st.lists(inner, max_size=3)),
    ),
    max_leaves=8,
)
item = st.dictionaries(st.text(min_size=1, max_size=6), attribute, max_size=5)


@given(item=item, at=st.integers(0, 2**62), origin=st.sampled_from(["us-east-1", "eu-west-1"]))
def test_stamping_then_hiding_gives_back_any_item(
    item: dict[str, Any], at: int, origin: str
) -> None:
    stamp = WireStamp(at, origin)
    body = {"TableName": "tally", "Item": {**KEY, **item}}
    stamped = stamp_request("PutItem", body, stamp, REPLICATED).body
    assert stamp_of(stamped["Item"]) == stamp
    if not set(item) & set(HIDDEN):
        assert without_hidden(stamped) == body


@given(
    a=st.tuples(st.integers(0, 9), st.sampled_from("ab")),
    b=st.tuples(st.integers(0, 9), st.sampled_from("ab")),
)
def test_stamps_order_by_time_then_region_name(a: tuple[int, str], b: tuple[int, str]) -> None:
    assert (WireStamp(*a) < WireStamp(*b)) == (a < b)


# Lower case: no name is one of the statements' upper-case PartiQL words.
TABLE_NAMES = st.from_regex(r"[a-z0-9_.-]{3,20}", fullmatch=True)


@given(replicated=TABLE_NAMES, regional=TABLE_NAMES, quoted=st.booleans())
def test_an_mrsc_transaction_is_refused_only_when_it_names_the_replicated_table(
    replicated: str, regional: str, quoted: bool
) -> None:
    """By ``TableName`` for the item APIs; by its whole name in PartiQL (an audit table named
    ``<table>-audit`` is not the table)."""
    items = {"TransactItems": [{"Put": {"TableName": regional, "Item": {}}}]}
    assert transaction_touches("TransactWriteItems", items, [replicated]) == (
        regional == replicated
    )
    gets = {"TransactItems": [{"Get": {"TableName": regional, "Key": {}}}]}
    assert transaction_touches("TransactGetItems", gets, [regional])
    name = f'"{regional}"' if quoted else regional
    partiql = {"TransactStatements": [{"Statement": f"INSERT INTO {name} VALUE {{'PK': 'a'}}"}]}
    assert transaction_touches("ExecuteTransaction", partiql, [regional])
    assert not transaction_touches("ExecuteTransaction", partiql, [f"{regional}-audit"])
    longer = {"TransactStatements": [{"Statement": f'DELETE FROM "{regional}-x" WHERE PK = 1'}]}
    assert not transaction_touches("ExecuteTransaction", longer, [regional])


def test_a_token_replayed_keeps_its_first_stamp_and_its_first_expiry() -> None:
    from tally.local.replication.proxy import TokenStamps
    from tally.local.replication.wire import WireStamp

    now = [0.0]
    tokens = TokenStamps(now=lambda: now[0])
    first, later = WireStamp(1, "us-east-1"), WireStamp(2, "us-east-1")
    tokens.keep("t", first)
    now[0] = 500.0
    tokens.keep("t", tokens.get("t") or later)  # the retry, answered: kept as it was
    assert tokens.get("t") == first
    now[0] = 601.0  # ten minutes after the first: a new request under an old token
    assert tokens.get("t") is None
    tokens.keep("t", later)
    assert tokens.get("t") == later
