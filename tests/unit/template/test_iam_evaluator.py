"""The IAM evaluator and the recorder's request mapping (tests/harness), on their own."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.harness.iam import NotModelled, Policy, Request, Statement
from tests.harness.iam_calls import _attributes, _requests

TABLE = "arn:aws:dynamodb:us-east-1:123456789012:table/Social"


def policy(*bodies: dict[str, Any]) -> Policy:
    return Policy("role", tuple(Statement("p", i, b) for i, b in enumerate(bodies)))


ALLOW = {"Effect": "Allow", "Action": ["dynamodb:*Item"], "Resource": [TABLE, f"{TABLE}/index/*"]}
DENY_MARKER = {
    "Effect": "Deny",
    "Action": ["dynamodb:PutItem", "dynamodb:UpdateItem"],
    "Resource": TABLE,
    "Condition": {"ForAnyValue:StringEquals": {"dynamodb:Attributes": ["tallyRepair"]}},
}


def test_wildcards_in_actions_and_resources() -> None:
    rules = policy(ALLOW)
    assert rules.evaluate(Request("dynamodb:GetItem", TABLE)).allowed
    assert rules.evaluate(Request("DynamoDB:getitem", TABLE)).allowed  # actions ignore case
    assert rules.evaluate(Request("dynamodb:Query", f"{TABLE}/index/ByNumber")).allowed is False
    assert not rules.evaluate(Request("dynamodb:GetItem", TABLE + "2")).allowed
    assert rules.evaluate(Request("dynamodb:BatchGetItem", TABLE)).allowed  # *Item matches it
    assert not rules.evaluate(Request("dynamodb:Scan", TABLE)).allowed


def test_a_deny_on_an_attribute_refuses_only_writes_naming_it() -> None:
    rules = policy(ALLOW, DENY_MARKER)
    marker = Request("dynamodb:UpdateItem", TABLE, {"dynamodb:Attributes": ("PK", "tallyRepair")})
    plain = Request("dynamodb:UpdateItem", TABLE, {"dynamodb:Attributes": ("PK", "likeTally")})
    decision = rules.evaluate(marker)
    assert not decision.allowed and decision.denied_by is not None
    assert rules.evaluate(plain).allowed
    assert rules.evaluate(Request("dynamodb:UpdateItem", TABLE)).allowed  # no key: no match


def test_for_all_values_holds_for_no_values_and_fails_on_one_outside() -> None:
    only = {
        **ALLOW,
        "Condition": {"ForAllValues:StringEquals": {"dynamodb:Attributes": ["PK", "SK"]}},
    }
    rules = policy(only)
    assert rules.evaluate(Request("dynamodb:GetItem", TABLE)).allowed
    assert rules.evaluate(
        Request("dynamodb:GetItem", TABLE, {"dynamodb:Attributes": ("PK",)})
    ).allowed
    outside = Request("dynamodb:GetItem", TABLE, {"dynamodb:Attributes": ("PK", "x")})
    assert not rules.evaluate(outside).allowed


def test_an_operator_it_does_not_model_is_refused_loudly() -> None:
    odd = {**ALLOW, "Condition": {"NumericLessThan": {"dynamodb:Limit": "10"}}}
    with pytest.raises(NotModelled, match="NumericLessThan"):
        policy(odd).evaluate(Request("dynamodb:GetItem", TABLE))


@given(st.lists(st.sampled_from(["PK", "SK", "likeTally", "tallyRepair", "total"]), max_size=5))
def test_an_explicit_deny_wins_over_any_allow(attributes: list[str]) -> None:
    request = Request("dynamodb:PutItem", TABLE, {"dynamodb:Attributes": tuple(attributes)})
    decision = policy(ALLOW, DENY_MARKER, ALLOW).evaluate(request)
    assert decision.allowed == ("tallyRepair" not in attributes)


def test_expression_attributes_resolve_names_and_skip_functions_and_values() -> None:
    body = {
        "Key": {"PK": {"S": "a"}, "SK": {"S": "b"}},
        "UpdateExpression": "SET #c = if_not_exists(#c, :z) + :one, tallyRevision = :r REMOVE #m",
        "ConditionExpression": "attribute_exists(PK) AND size(#l[0]) > :n",
        "ExpressionAttributeNames": {"#c": "likeTally", "#m": "tallyRepair", "#l": "lines"},
    }
    assert _attributes(body) == {"PK", "SK", "likeTally", "tallyRevision", "tallyRepair", "lines"}


def test_a_transaction_is_one_request_per_item_with_its_own_action() -> None:
    params = {
        "TransactItems": [
            {"Put": {"TableName": "t", "Item": {"PK": {}, "SK": {}, "n": {}}}},
            {"Update": {"TableName": "a", "Key": {"PK": {}}, "UpdateExpression": "SET x = :x"}},
            {"Delete": {"TableName": "t", "Key": {"PK": {}}}},
            {"ConditionCheck": {"TableName": "t", "Key": {"PK": {}}}},
        ]
    }
    assert [
        (name, action)
        for _, name, _, action, _ in _requests("dynamodb", "TransactWriteItems", params)
    ] == [
        ("t", "PutItem"),
        ("a", "UpdateItem"),
        ("t", "DeleteItem"),
        ("t", "ConditionCheckItem"),
    ]
    batch = {"RequestItems": {"t": {"Keys": [{"pk": {}}], "ConsistentRead": True}}}
    assert _requests("dynamodb", "BatchGetItem", batch) == [
        ("table", "t", None, "BatchGetItem", ("pk",))
    ]
    query = {"TableName": "t", "IndexName": "ByNumber"}
    assert _requests("dynamodb", "Query", query) == [("index", "t", "ByNumber", "Query", None)]
