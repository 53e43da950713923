"""The writer API's contract for refusals, on DynamoDB Local through the real handler.

A refused request (any 4xx) leaves the table unchanged byte for byte; no accepted amount can
leave a total that refuses the next line; a counter or revision a writer cannot add to is
refused naming that attribute; error bodies stay small; API Gateway REST (v1) and HTTP API
(v2) events are both served, base64 bodies included.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Context, Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.http import encoded, http_event, invoke, invoke_event, rest_event
from tests.integration.test_writer_api import _invoker, get, put

POST = {"PK": "POST#a91f", "SK": "META"}
LIKE = {"PK": "POST#a91f", "SK": "LIKE#USER#7c20"}
ORDER = {"PK": "ORDER#17", "SK": "META"}
LINE = {"PK": "ORDER#17", "SK": "LINE#3"}
PROJECT = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
USERS = {"PK": "UserMetadata", "SK": "META"}
ERROR_BODY_LIMIT = 4096
_EXACT = Context(prec=400)


@pytest.fixture
def call(monkeypatch: pytest.MonkeyPatch, dynamodb_endpoint: str, table_name: str) -> Iterator[Any]:
    yield from _invoker(monkeypatch, dynamodb_endpoint, table_name)


def snapshot(dynamodb: Any, table: str) -> list[str]:
    """Every item as DynamoDB returns it (numbers as their text), in a stable order."""
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = dynamodb.scan(**kwargs)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return sorted(json.dumps(item, sort_keys=True) for item in items)


def number(text: str) -> Decimal:
    return Decimal(text)


# --- a refused allocation writes nothing ------------------------------------------------

BAD_SEQUENCE_COUNTERS = ["2.5", "-1", "-5", "0.5", "1E+40", "9" * 38]


@pytest.mark.parametrize("strategy", ["atomic", "gapless", "sortkey", "block"])
@pytest.mark.parametrize("value", BAD_SEQUENCE_COUNTERS)
def test_a_refused_allocation_leaves_the_table_unchanged_byte_for_byte(
    call, dynamodb, table_name, strategy, value
) -> None:
    put(dynamodb, table_name, {**PROJECT, "lastIssue": number(value)})
    before = snapshot(dynamodb, table_name)
    body: dict[str, Any] = {"counter": PROJECT, "strategy": strategy}
    if strategy == "block":
        body["count"] = 3
    status, answer = call("POST", "/allocations", body)
    assert status == 409, answer
    assert answer["attribute"] == "lastIssue" and "lastIssue" in answer["error"], answer
    assert snapshot(dynamodb, table_name) == before


@pytest.mark.parametrize("value", ["-1", "-5", "2.5"])
def test_an_allocation_by_natural_key_on_a_bad_counter_is_refused(
    call, dynamodb, table_name, value
) -> None:
    put(dynamodb, table_name, {**USERS, "LastID": number(value)})
    before = snapshot(dynamodb, table_name)
    body = {"counter": USERS, "member_key": {"PK": "User#ann", "SK": "PROFILE"}}
    status, answer = call("POST", "/allocations", body)
    assert (status, answer.get("attribute")) == (409, "LastID"), answer
    assert snapshot(dynamodb, table_name) == before


@pytest.mark.parametrize("strategy", ["atomic", "gapless", "sortkey", "block"])
def test_an_allocation_on_a_sound_counter_still_counts_on(
    call, dynamodb, table_name, strategy
) -> None:
    put(dynamodb, table_name, {**PROJECT, "lastIssue": Decimal(4)})
    body: dict[str, Any] = {"counter": PROJECT, "strategy": strategy}
    status, answer = call("POST", "/allocations", body)
    assert (status, answer["numbers"]) == (201, [5]), answer


# --- an amount outside the rule's domain is refused at the door --------------------------

OUT_OF_DOMAIN = ["1E-130", "1E-40", "-1E-130", "1E+37", "0.001", "1000000000000000.01", "-2E+15"]


@pytest.mark.parametrize("amount", OUT_OF_DOMAIN)
def test_a_first_line_outside_the_amount_domain_is_refused_naming_the_domain(
    call, dynamodb, table_name, amount
) -> None:
    put(dynamodb, table_name, {**ORDER, "total": Decimal(0)})
    before = snapshot(dynamodb, table_name)
    body = f'{{"key": {json.dumps(LINE)}, "attributes": {{"amount": {amount}}}}}'
    status, answer = call("POST", "/children", body)
    assert status == 422, answer
    error = answer["detail"][0]
    assert error["loc"] == ["body", "attributes", "amount"], error
    assert "2 decimal places" in error["msg"] and "1E+15" in error["msg"], error
    assert snapshot(dynamodb, table_name) == before


@pytest.mark.parametrize("amount", OUT_OF_DOMAIN)
def test_a_changed_amount_outside_the_domain_is_refused_naming_the_domain(
    call, dynamodb, table_name, amount
) -> None:
    put(dynamodb, table_name, {**ORDER, "total": Decimal(5)})
    put(dynamodb, table_name, {**LINE, "amount": Decimal(5)})
    before = snapshot(dynamodb, table_name)
    body = f'{{"key": {json.dumps(LINE)}, "amount": {amount}}}'
    status, answer = call("PATCH", "/children", body)
    assert status == 422, answer
    assert answer["detail"][0]["loc"] == ["body", "amount"], answer
    assert snapshot(dynamodb, table_name) == before


def test_amounts_at_the_edges_of_the_domain_are_accepted_and_summed_exactly(
    call, dynamodb, table_name
) -> None:
    put(dynamodb, table_name, {**ORDER, "total": Decimal(0)})
    for n, amount in enumerate(["1E+15", "-1E+15", "0.01", "999999999999999.99", "-0.01"]):
        line = {**ORDER, "SK": f"LINE#{n}"}
        body = f'{{"key": {json.dumps(line)}, "attributes": {{"amount": {amount}}}}}'
        status, answer = call("POST", "/children", body)
        assert status == 201, (amount, answer)
    item = dynamodb.get_item(TableName=table_name, Key={k: {"S": v} for k, v in ORDER.items()})
    assert item["Item"]["total"] == {"N": "999999999999999.99"}


# Numbers from DynamoDB's whole domain: 1 to 38 significant digits, leading digit at 10**-130
# up to 10**125.
domain_numbers = st.builds(
    lambda sign, digits, adjusted: Decimal((sign, tuple(digits), adjusted - len(digits) + 1)),
    st.integers(0, 1),
    st.lists(st.integers(0, 9), min_size=1, max_size=38).filter(lambda d: d[0] != 0),
    st.integers(-130, 125),
)
in_domain = st.decimals(min_value=-(10**15), max_value=10**15, places=2)


def test_no_amount_from_the_whole_number_domain_can_poison_an_order(
    call, dynamodb, table_name
) -> None:
    """Whatever the first line's amount, the order then takes any amount in the domain; an
    amount refused (422 naming it) leaves the table as it was."""
    orders = iter(range(10**6))

    @settings(
        max_examples=120,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(first=st.one_of(domain_numbers, in_domain), second=in_domain)
    def run(first: Decimal, second: Decimal) -> None:
        order = {"PK": f"ORDER#p{next(orders)}", "SK": "META"}
        put(dynamodb, table_name, {**order, "total": Decimal(0)})
        before = snapshot(dynamodb, table_name)
        lines = [{**order, "SK": "LINE#1"}, {**order, "SK": "LINE#2"}]
        body = f'{{"key": {json.dumps(lines[0])}, "attributes": {{"amount": {first}}}}}'
        status, answer = call("POST", "/children", body)
        fits = first == first.quantize(Decimal("0.01"), context=_EXACT) and (
            first.copy_abs() <= Decimal("1E+15")
        )
        if fits:
            assert status == 201, (first, answer)
        else:
            assert status == 422, (first, answer)
            assert answer["detail"][0]["loc"] == ["body", "attributes", "amount"]
            assert snapshot(dynamodb, table_name) == before
        body = f'{{"key": {json.dumps(lines[1])}, "attributes": {{"amount": {second}}}}}'
        status, answer = call("POST", "/children", body)
        assert status == 201, (first, second, answer)
        raw = dynamodb.get_item(
            TableName=table_name, Key={k: {"S": v} for k, v in order.items()}, ConsistentRead=True
        )
        expected = _EXACT.add(first if fits else Decimal(0), second)
        assert Decimal(raw["Item"]["total"]["N"]) == expected

    run()


# --- a counter or revision a writer cannot add to ----------------------------------------

UNADDABLE = ["1E+40", "-1E+40", "5E+38", "9" * 38]


@pytest.mark.parametrize("value", UNADDABLE)
@pytest.mark.parametrize("attribute", ["likeTally", "tallyRevision"])
def test_an_increment_on_a_counter_or_revision_past_the_range_names_it(
    call, dynamodb, table_name, attribute, value
) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": Decimal(0), attribute: number(value)})
    before = snapshot(dynamodb, table_name)
    status, answer = call("POST", "/children", {"key": LIKE})
    assert 400 <= status < 500, answer
    assert answer.get("attribute") == attribute and attribute in answer["error"], answer
    assert snapshot(dynamodb, table_name) == before


@pytest.mark.parametrize("value", UNADDABLE)
@pytest.mark.parametrize("attribute", ["total", "tallyRevision"])
def test_a_line_on_a_total_or_revision_past_the_range_names_it(
    call, dynamodb, table_name, attribute, value
) -> None:
    put(dynamodb, table_name, {**ORDER, "total": Decimal(0), attribute: number(value)})
    before = snapshot(dynamodb, table_name)
    status, answer = call("POST", "/children", {"key": LINE, "attributes": {"amount": 1}})
    assert 400 <= status < 500, answer
    assert answer.get("attribute") == attribute and attribute in answer["error"], answer
    assert "detail" not in answer  # not blamed on the amount
    assert snapshot(dynamodb, table_name) == before


@pytest.mark.parametrize("attribute", ["likeTally", "tallyRevision"])
def test_a_removal_on_a_counter_past_the_range_names_it(
    call, dynamodb, table_name, attribute
) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": Decimal(1), attribute: Decimal("1E+40")})
    put(dynamodb, table_name, LIKE)
    before = snapshot(dynamodb, table_name)
    status, answer = call("DELETE", "/children", {"key": LIKE})
    assert (status, answer.get("attribute")) == (409, attribute), answer
    assert snapshot(dynamodb, table_name) == before


# Amounts DynamoDB holds that no writer stores under the order-total rule's domain (at most
# 2 decimal places, |amount| <= 1E+15): a foreign writer's, or one from before the domain.
# DynamoDB returns 1E+40 as 41 digits, 1.23456789E+125 as 126.
FOREIGN_AMOUNTS = ["1E+40", "-1E+40", "9" * 38, "1E-100", "1.23456789E+125", "1E+20", "0.001"]


@pytest.mark.parametrize("amount", FOREIGN_AMOUNTS)
@pytest.mark.parametrize("total", ["0", "5", "same"])
@pytest.mark.parametrize("method", ["DELETE", "PATCH"])
def test_a_line_whose_stored_amount_no_writer_stores_is_judged_never_a_5xx(
    call, dynamodb, table_name, method, amount, total
) -> None:
    """Removing the line, or changing its amount to 5: never a 5xx. A refusal (4xx) names the
    amount and writes nothing; a success moved the total by exactly the difference."""
    total = amount if total == "same" else total
    put(dynamodb, table_name, {**ORDER, "total": number(total)})
    put(dynamodb, table_name, {**LINE, "amount": number(amount)})
    before = snapshot(dynamodb, table_name)
    body: dict[str, Any] = {"key": LINE} | ({"amount": 5} if method == "PATCH" else {})
    status, answer = call(method, "/children", body)
    assert status < 500, answer
    if status >= 400:
        assert answer.get("attribute") == "amount" and "amount" in answer["error"], answer
        assert answer["key"] == LINE, answer
        assert snapshot(dynamodb, table_name) == before
        return
    new = Decimal(5) if method == "PATCH" else Decimal(0)
    assert (get(dynamodb, table_name, LINE) or {}).get("amount") == (new or None)
    expected = _EXACT.add(_EXACT.subtract(number(total), number(amount)), new)
    assert (get(dynamodb, table_name, ORDER) or {})["total"] == expected


def test_an_atomic_allocation_for_a_registered_natural_key_writes_nothing(
    call, dynamodb, table_name
) -> None:
    put(dynamodb, table_name, {**USERS, "LastID": Decimal(1)})
    user = {"PK": "User#ann", "SK": "PROFILE"}
    put(dynamodb, table_name, {**user, "NumIdentifier": Decimal(1), "seqName": "user-numbers"})
    before = snapshot(dynamodb, table_name)
    body = {"counter": USERS, "member_key": user, "strategy": "atomic"}
    status, answer = call("POST", "/allocations", body)
    assert (status, answer["outcome"], answer["numbers"]) == (409, "already_present", [1])
    assert snapshot(dynamodb, table_name) == before


# --- error bodies stay small ----------------------------------------------------------------

HUGE = "x" * 1_000_000
HUGE_BODIES = {
    "an unknown field with a 1 MB name": (
        "/children",
        {"key": LIKE, HUGE: 1},
        ["body", HUGE],
    ),
    "an attribute with a 1 MB name": (
        "/children",
        {"key": LIKE, "attributes": {HUGE: 1}},
        ["body", "attributes", HUGE],
    ),
    "a 1 MB key value": ("/children", {"key": {"PK": "POST#" + HUGE, "SK": "X"}}, ["body", "key"]),
    "a 1 MB string where a number goes": (
        "/allocations",
        {"counter": PROJECT, "count": HUGE},
        ["body", "count"],
    ),
    "a 1 MB nested attribute name": (
        "/children",
        {"key": LIKE, "attributes": {"m": {"": HUGE, HUGE: None, "y": {HUGE: []}}}},
        ["body", "attributes", "m", ""],
    ),
    "a 1 MB body that is not JSON": ("/children", "{" + HUGE, ["body"]),
}


@pytest.mark.parametrize("case", HUGE_BODIES)
def test_an_error_body_for_a_1mb_request_is_bounded_and_names_the_field(
    call, dynamodb, table_name, case
) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": Decimal(0)})
    before = snapshot(dynamodb, table_name)
    path, body, loc = HUGE_BODIES[case]
    response = invoke_event(http_event("POST", path, body))
    status, answer = response
    assert 400 <= status < 500, str(answer)[:500]
    text = json.dumps(answer)
    assert len(text) <= ERROR_BODY_LIMIT, text[:500]
    error = answer["detail"][0]
    # The field is named; a name too long to echo is cut, marked with how much was left out.
    for sent, named in zip(loc, error["loc"], strict=False):
        assert str(named)[:40] == str(sent)[:40]
    assert snapshot(dynamodb, table_name) == before


# --- event shapes: REST (v1), HTTP (v2), base64 bodies ---------------------------------------


@pytest.mark.parametrize("shape", ["v1", "v2", "v1-base64", "v2-base64"])
def test_an_event_of_either_shape_and_either_encoding_is_served(
    call, dynamodb, table_name, shape
) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": Decimal(0)})
    make = rest_event if shape.startswith("v1") else http_event
    event = make("POST", "/children", {"key": LIKE}, {"Idempotency-Key": f"k-{shape}"})
    if shape.endswith("base64"):
        event = encoded(event)
    status, answer = invoke_event(event)
    assert (status, answer["outcome"]) == (201, "created"), answer
    repeat = invoke_event(event)
    assert repeat[0] == 201 and repeat[1]["replayed"] is True
    item = dynamodb.get_item(TableName=table_name, Key={k: {"S": v} for k, v in POST.items()})
    assert item["Item"]["likeTally"] == {"N": "1"}


@pytest.mark.parametrize("shape", ["v1", "v2"])
@pytest.mark.parametrize("body", ["!!!not base64", "eyJrZXk", "////", "\u00e9t\u00e9"])
def test_a_body_flagged_base64_that_is_not_is_a_400(
    call, dynamodb, table_name, shape, body
) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": Decimal(0)})
    before = snapshot(dynamodb, table_name)
    make = rest_event if shape == "v1" else http_event
    event = {**make("POST", "/children", {"key": LIKE}), "body": body, "isBase64Encoded": True}
    status, answer = invoke_event(event)
    assert status == 400, answer
    assert answer["detail"][0]["loc"] == ["body"], answer
    assert snapshot(dynamodb, table_name) == before


def test_base64_text_that_is_not_utf8_is_a_400(call, dynamodb, table_name) -> None:
    event = {**http_event("POST", "/children", ""), "body": "/w==", "isBase64Encoded": True}
    status, answer = invoke_event(event)
    assert status == 400, answer


def test_an_event_that_is_no_api_gateway_request_is_a_400(call) -> None:
    for event in ({}, {"version": "2.0"}, {"httpMethod": "POST"}, {"body": "x"}):
        status, _ = invoke_event(event)
        assert status == 400


def test_the_openapi_document_is_served_to_a_rest_api_too(call) -> None:
    status, document = invoke_event(rest_event("GET", "/openapi.json", ""))
    assert status == 200 and "/children" in document["paths"]


def test_v2_invoke_helper_still_answers(call, dynamodb, table_name) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": Decimal(0)})
    assert invoke("POST", "/children", {"key": LIKE})[0] == 201
