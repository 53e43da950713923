"""The writer HTTP API in process: API Gateway HTTP API v2 events against DynamoDB Local."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

import tally.core.settings
from tally.core.observability import metrics
from tally.handlers import writer_api
from tests.harness.http import invoke
from tests.harness.tables import throwaway_table

_ser, _de = TypeSerializer(), TypeDeserializer()
POST = {"PK": "POST#a91f", "SK": "META"}
LIKE = {"PK": "POST#a91f", "SK": "LIKE#USER#7c20"}
ORDER = {"PK": "ORDER#17", "SK": "META"}
LINE = {"PK": "ORDER#17", "SK": "LINE#3"}


@pytest.fixture
def call(monkeypatch: pytest.MonkeyPatch, dynamodb_endpoint: str, table_name: str) -> Iterator[Any]:
    """Invoke the handler on this test's table; returns (status, parsed JSON body)."""
    yield from _invoker(monkeypatch, dynamodb_endpoint, table_name)


@pytest.fixture(scope="module")
def shared(dynamodb: Any, template: dict[str, Any]) -> Iterator[str]:
    """One table for requests that are refused: they leave it as it was."""
    with throwaway_table(dynamodb, template) as name:
        put(dynamodb, name, {**POST, "likeTally": 0})
        put(dynamodb, name, {**ORDER, "total": 0})
        yield name


@pytest.fixture
def call_shared(
    monkeypatch: pytest.MonkeyPatch, dynamodb_endpoint: str, shared: str
) -> Iterator[Any]:
    yield from _invoker(monkeypatch, dynamodb_endpoint, shared)


def _invoker(
    monkeypatch: pytest.MonkeyPatch,
    dynamodb_endpoint: str,
    table: str,
    rules_file: Path | None = None,
) -> Iterator[Any]:
    """The writer API's handler on ``table``, with ``rules_file`` (else the default rules)."""
    monkeypatch.setenv("TABLE_NAME", table)
    monkeypatch.setenv("DYNAMODB_ENDPOINT", dynamodb_endpoint)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "TallyTest")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "tally")
    if rules_file is None:
        monkeypatch.delenv("RULES_FILE", raising=False)
    else:
        monkeypatch.setenv("RULES_FILE", str(rules_file))
    # Metrics reads its namespace when first imported, possibly before this fixture ran.
    monkeypatch.setattr(metrics, "namespace", "TallyTest")
    tally.core.settings.settings.cache_clear()
    writer_api._writers.cache_clear()

    yield invoke
    tally.core.settings.settings.cache_clear()
    writer_api._writers.cache_clear()


def put(dynamodb: Any, table: str, item: dict[str, Any]) -> None:
    dynamodb.put_item(TableName=table, Item={k: _ser.serialize(v) for k, v in item.items()})


def get(dynamodb: Any, table: str, key: dict[str, str]) -> dict[str, Any] | None:
    response = dynamodb.get_item(
        TableName=table, Key={k: _ser.serialize(v) for k, v in key.items()}, ConsistentRead=True
    )
    item = response.get("Item")
    return {k: _de.deserialize(v) for k, v in item.items()} if item else None


@pytest.fixture
def post(dynamodb: Any, table_name: str) -> dict[str, str]:
    put(dynamodb, table_name, {**POST, "likeTally": 0})
    return POST


@pytest.fixture
def order(dynamodb: Any, table_name: str) -> dict[str, str]:
    put(dynamodb, table_name, {**ORDER, "total": 0})
    return ORDER


def like_tally(dynamodb: Any, table: str) -> Any:
    return (get(dynamodb, table, POST) or {}).get("likeTally")


# --- POST /children -----------------------------------------------------------------------


def test_add_child_creates_it_and_counts_it(call, post, dynamodb, table_name) -> None:
    status, body = call("POST", "/children", {"key": LIKE})
    assert (status, body["outcome"], body["replayed"]) == (201, "created", False)
    assert like_tally(dynamodb, table_name) == 1
    assert get(dynamodb, table_name, LIKE) is not None


def test_same_like_again_without_a_key_is_a_conflict(call, post, dynamodb, table_name) -> None:
    call("POST", "/children", {"key": LIKE})
    status, body = call("POST", "/children", {"key": LIKE})
    assert (status, body["outcome"]) == (409, "already_present")
    assert like_tally(dynamodb, table_name) == 1


def test_retry_with_the_same_idempotency_key_replays(call, post, dynamodb, table_name) -> None:
    headers = {"Idempotency-Key": "like-7c20-a91f"}
    first = call("POST", "/children", {"key": LIKE}, headers)
    status, body = call("POST", "/children", {"key": LIKE}, headers)
    assert first[0] == 201
    assert (status, body["outcome"], body["replayed"]) == (201, "created", True)
    assert like_tally(dynamodb, table_name) == 1


def test_add_child_keeps_its_attributes(call, post, dynamodb, table_name) -> None:
    call("POST", "/children", {"key": LIKE, "attributes": {"by": "7c20"}})
    assert (get(dynamodb, table_name, LIKE) or {}).get("by") == "7c20"


def test_add_child_of_a_missing_parent_writes_nothing(call, dynamodb, table_name) -> None:
    status, body = call("POST", "/children", {"key": LIKE})
    assert status == 404
    assert body["key"] == POST
    assert get(dynamodb, table_name, LIKE) is None
    assert get(dynamodb, table_name, POST) is None


def test_a_write_to_a_parent_homed_in_another_region_is_a_conflict_naming_its_home(
    monkeypatch: pytest.MonkeyPatch, call, dynamodb, table_name
) -> None:
    monkeypatch.setenv("GLOBAL_REGIONS", "us-east-1,eu-west-1")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    tally.core.settings.settings.cache_clear()
    writer_api._writers.cache_clear()
    put(dynamodb, table_name, {**POST, "likeTally": 0, "tallyHome": "us-east-1"})
    status, body = call("POST", "/children", {"key": LIKE})
    assert (status, body["conflict"], body["home"], body["key"]) == (
        409,
        "homed_elsewhere",
        "us-east-1",
        POST,
    )
    assert get(dynamodb, table_name, LIKE) is None
    assert like_tally(dynamodb, table_name) == 0


def refused(response: tuple[int, dict[str, Any]], *loc: Any) -> dict[str, Any]:
    """The 422's first error, after checking it names ``loc`` (the field)."""
    status, body = response
    assert status == 422, body
    error: dict[str, Any] = body["detail"][0]
    assert error["loc"] == list(loc), error
    return error


def test_body_that_is_not_json_is_unprocessable(call, post) -> None:
    error = refused(call("POST", "/children", "{not json"), "body", 1)
    assert error["type"] == "json_invalid"


def test_missing_key_is_unprocessable_naming_key(call, post) -> None:
    assert refused(call("POST", "/children", {"attributes": {}}), "body", "key")["type"] == (
        "missing"
    )


def test_unknown_field_is_unprocessable_naming_it(call, post, dynamodb, table_name) -> None:
    error = refused(call("POST", "/children", {"key": LIKE, "colour": "red"}), "body", "colour")
    assert error["type"] == "extra_forbidden"
    assert get(dynamodb, table_name, LIKE) is None


def test_key_matching_no_rule_is_unprocessable(call, post, dynamodb, table_name) -> None:
    stray = {"PK": "POST#a91f", "SK": "COMMENT#1"}
    error = refused(call("POST", "/children", {"key": stray}), "body", "key")
    assert "COMMENT#1" in error["msg"]
    assert get(dynamodb, table_name, stray) is None
    assert like_tally(dynamodb, table_name) == 0


def test_string_counter_is_a_conflict_and_writes_nothing(call, dynamodb, table_name) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": "many"})
    status, body = call("POST", "/children", {"key": LIKE})
    assert status == 409
    assert "'likeTally'" in body["error"]
    assert get(dynamodb, table_name, LIKE) is None
    assert like_tally(dynamodb, table_name) == "many"


# --- DELETE /children ---------------------------------------------------------------------


def test_delete_removes_once_then_is_not_found(call, post, dynamodb, table_name) -> None:
    call("POST", "/children", {"key": LIKE})
    first = call("DELETE", "/children", {"key": LIKE})
    second = call("DELETE", "/children", {"key": LIKE})
    assert (first[0], first[1]["outcome"]) == (200, "removed")
    assert (second[0], second[1]["outcome"]) == (404, "not_present")
    assert like_tally(dynamodb, table_name) == 0
    assert get(dynamodb, table_name, LIKE) is None


def test_like_unlike_like_counts_one(call, post, dynamodb, table_name) -> None:
    call("POST", "/children", {"key": LIKE})
    call("DELETE", "/children", {"key": LIKE})
    status, _ = call("POST", "/children", {"key": LIKE})
    assert status == 201
    assert like_tally(dynamodb, table_name) == 1


# --- sums ---------------------------------------------------------------------------------


def line_json(sk: str, amount: str, field: str = "attributes") -> str:
    """A body with the amount as literal JSON text, so it never passes through a float."""
    value = f'{{"amount": {amount}}}' if field == "attributes" else amount
    return f'{{"key": {{"PK": "ORDER#17", "SK": "{sk}"}}, "{field}": {value}}}'


def test_patch_changes_amount_and_total_exactly(call, order, dynamodb, table_name) -> None:
    call("POST", "/children", line_json("LINE#3", "10.10"))
    call("POST", "/children", line_json("LINE#4", "0.20"))
    assert (get(dynamodb, table_name, ORDER) or {})["total"] == Decimal("10.30")
    status, body = call("PATCH", "/children", line_json("LINE#3", "0.05", field="amount"))
    assert (status, body["outcome"]) == (200, "changed")
    assert (get(dynamodb, table_name, LINE) or {})["amount"] == Decimal("0.05")
    assert (get(dynamodb, table_name, ORDER) or {})["total"] == Decimal("0.25")


def test_float_looking_json_number_stays_exact(call, order, dynamodb, table_name) -> None:
    call("POST", "/children", line_json("LINE#3", "0.1"))
    assert (get(dynamodb, table_name, LINE) or {})["amount"] == Decimal("0.1")
    assert (get(dynamodb, table_name, ORDER) or {})["total"] == Decimal("0.1")


def test_patch_on_a_count_child_is_unprocessable(call, post, dynamodb, table_name) -> None:
    call("POST", "/children", {"key": LIKE})
    error = refused(call("PATCH", "/children", {"key": LIKE, "amount": 3}), "body", "amount")
    assert "'likes'" in error["msg"]
    assert like_tally(dynamodb, table_name) == 1


# --- POST /allocations --------------------------------------------------------------------

PROJECT = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}


def test_gapless_allocations_hand_out_consecutive_numbers(call, dynamodb, table_name) -> None:
    first = call("POST", "/allocations", {"counter": PROJECT})
    second = call("POST", "/allocations", {"counter": PROJECT})
    assert (first[0], first[1]["numbers"]) == (201, [1])
    assert (second[0], second[1]["numbers"]) == (201, [2])
    assert (get(dynamodb, table_name, PROJECT) or {})["lastIssue"] == 2
    assert get(dynamodb, table_name, {"PK": "PROJECT#A", "SK": "ISSUE#0000000002"}) is not None


def test_block_allocation_continues_the_sequence(call, dynamodb, table_name) -> None:
    call("POST", "/allocations", {"counter": PROJECT})
    call("POST", "/allocations", {"counter": PROJECT})
    status, body = call(
        "POST", "/allocations", {"counter": PROJECT, "strategy": "block", "count": 3}
    )
    assert (status, body["numbers"]) == (201, [3, 4, 5])
    assert (get(dynamodb, table_name, PROJECT) or {})["lastIssue"] == 5


def test_block_of_99_is_unprocessable_naming_count(call, dynamodb, table_name) -> None:
    request = {"counter": PROJECT, "strategy": "block", "count": 99}
    assert refused(call("POST", "/allocations", request), "body", "count")["type"] == (
        "less_than_equal"
    )
    assert get(dynamodb, table_name, PROJECT) is None


def test_natural_key_member_twice_keeps_its_number(call, dynamodb, table_name) -> None:
    request = {
        "counter": {"PK": "UserMetadata", "SK": "META"},
        "member_key": {"PK": "User#Kirk", "SK": "PROFILE"},
    }
    first = call("POST", "/allocations", request)
    second = call("POST", "/allocations", request)
    assert first[0] == 201 and second[0] == 409
    assert second[1]["outcome"] == "already_present"
    assert second[1]["numbers"] == first[1]["numbers"]
    assert (get(dynamodb, table_name, {"PK": "UserMetadata", "SK": "META"}) or {})["LastID"] == 1


# --- client mistakes: a 4xx naming the field, nothing written -----------------------------

LIKE_1 = {"PK": "POST#a91f", "SK": "LIKE#1"}
NESTED_40 = "[" * 40 + "]" * 40
MISTAKES: dict[str, tuple[str, str, Any, tuple[Any, ...]]] = {
    "amount 1e400": (
        "POST",
        "/children",
        '{"key": {"PK": "ORDER#17", "SK": "LINE#1"}, "attributes": {"amount": 1e400}}',
        ("body", "attributes", "amount"),
    ),
    "amount of 39 digits": (
        "POST",
        "/children",
        '{"key": {"PK": "ORDER#17", "SK": "LINE#1"}, "attributes": {"amount": ' + "1" * 39 + "}}",
        ("body", "attributes", "amount"),
    ),
    "an integer of 5,000 digits": (
        "POST",
        "/children",
        '{"key": {"PK": "POST#a91f", "SK": "LIKE#1"}, "attributes": {"n": ' + "7" * 5000 + "}}",
        ("body", "attributes", "n"),
    ),
    "NaN": (
        "POST",
        "/children",
        '{"key": {"PK": "POST#a91f", "SK": "LIKE#1"}, "attributes": {"x": NaN}}',
        ("body", "attributes", "x"),
    ),
    "Infinity in an amount": (
        "PATCH",
        "/children",
        '{"key": {"PK": "ORDER#17", "SK": "LINE#3"}, "amount": -Infinity}',
        ("body", "amount"),
    ),
    "an amount that is a string": (
        "PATCH",
        "/children",
        {"key": LINE, "amount": "12.5"},
        ("body", "amount"),
    ),
    "a partition key over 2048 bytes": (
        "POST",
        "/children",
        {"key": {"PK": "POST#" + "a" * 3000, "SK": "LIKE#1"}},
        ("body", "key", "PK"),
    ),
    "a sort key over 1024 bytes": (
        "DELETE",
        "/children",
        {"key": {"PK": "POST#a91f", "SK": "LIKE#" + "a" * 1100}},
        ("body", "key", "SK"),
    ),
    "a key value that is a number": (
        "POST",
        "/children",
        {"key": {"PK": "POST#a91f", "SK": Decimal(1)}},
        ("body", "key", "SK"),
    ),
    "a lone surrogate": (
        "POST",
        "/children",
        '{"key": {"PK": "POST#a91f", "SK": "LIKE#\\ud800"}}',
        ("body", "key", "SK"),
    ),
    "an empty attribute name": (
        "POST",
        "/children",
        {"key": LIKE_1, "attributes": {"": 1}},
        ("body", "attributes", ""),
    ),
    "a huge attribute name": (
        "POST",
        "/children",
        {"key": LIKE_1, "attributes": {"n" * 70_000: 1}},
        # Named, and cut to keep the error body small.
        ("body", "attributes", "n" * 64 + "...[69936 more characters]"),
    ),
    "an item over 400 KB": (
        "POST",
        "/children",
        {"key": LIKE_1, "attributes": {"x": "y" * 410_000}},
        ("body", "attributes"),
    ),
    "nesting over 32 levels": (
        "POST",
        "/children",
        '{"key": {"PK": "POST#a91f", "SK": "LIKE#1"}, "attributes": {"x": ' + NESTED_40 + "}}",
        ("body", "attributes", "x", *[0] * 31),
    ),
    "JSON nested 100,000 deep": (
        "POST",
        "/children",
        '{"key": {"PK": "POST#a91f", "SK": "LIKE#1"}, "attributes": {"x": '
        + "[" * 100_000
        + "]" * 100_000
        + "}}",
        ("body", 0),
    ),
    "the counter": (
        "POST",
        "/children",
        {"key": LIKE_1, "attributes": {"likeTally": 1}},
        ("body", "attributes", "likeTally"),
    ),
    "the repair marker": (
        "POST",
        "/children",
        {"key": LIKE_1, "attributes": {"tallyRepair": "x"}},
        ("body", "attributes", "tallyRepair"),
    ),
    "the TTL attribute": (
        "POST",
        "/children",
        {"key": LIKE_1, "attributes": {"expiresAt": 1_900_000_000}},
        ("body", "attributes", "expiresAt"),
    ),
    "a sequence attribute on a member": (
        "POST",
        "/allocations",
        {"counter": PROJECT, "attributes": {"seqName": "user-numbers"}},
        ("body", "attributes", "seqName"),
    ),
    "an atomic member over 400 KB": (
        "POST",
        "/allocations",
        {"counter": PROJECT, "strategy": "atomic", "attributes": {"x": "y" * 410_000}},
        ("body", "attributes"),
    ),
    "a count that is not a number": (
        "POST",
        "/allocations",
        {"counter": PROJECT, "strategy": "block", "count": "5"},
        ("body", "count"),
    ),
    "a count of 2.5": (
        "POST",
        "/allocations",
        '{"counter": {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}, "strategy": "block", '
        '"count": 2.5}',
        ("body", "count"),
    ),
    "an unknown strategy": (
        "POST",
        "/allocations",
        {"counter": PROJECT, "strategy": "fast"},
        ("body", "strategy"),
    ),
    "a body that is a list": ("POST", "/children", [1, 2], ("body", "key")),
}


@pytest.mark.parametrize("case", MISTAKES)
def test_a_client_mistake_is_a_422_naming_the_field_and_writes_nothing(
    case, call_shared, dynamodb, shared
) -> None:
    method, path, body, loc = MISTAKES[case]
    before = dynamodb.scan(TableName=shared, ConsistentRead=True)["Items"]
    error = refused(call_shared(method, path, body), *loc)
    assert error["msg"]
    assert dynamodb.scan(TableName=shared, ConsistentRead=True)["Items"] == before


def test_an_idempotency_key_over_255_characters_is_refused(call, post, dynamodb, table_name):
    response = call("POST", "/children", {"key": LIKE}, {"Idempotency-Key": "k" * 256})
    refused(response, "header", "idempotency-key")
    assert get(dynamodb, table_name, LIKE) is None


def test_a_form_body_is_refused_not_crashed(call, post) -> None:
    event_headers = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _ = call("POST", "/children", "key=1", event_headers)
    assert status == 422


# --- idempotency keys ---------------------------------------------------------------------


def test_same_key_other_body_is_a_422_on_the_header(call, order, dynamodb, table_name) -> None:
    headers = {"Idempotency-Key": "line-3"}
    assert call("POST", "/children", line_json("LINE#3", "5"), headers)[0] == 201
    error = refused(
        call("POST", "/children", line_json("LINE#3", "6"), headers), "header", "idempotency-key"
    )
    assert error["type"] == "idempotency_key_reused"
    assert (get(dynamodb, table_name, ORDER) or {})["total"] == 5


def test_add_remove_add_under_one_key_is_a_409_not_a_claim(call, post, dynamodb, table_name):
    headers = {"Idempotency-Key": "like-7c20"}
    assert call("POST", "/children", {"key": LIKE}, headers)[0] == 201
    assert call("DELETE", "/children", {"key": LIKE})[0] == 200
    status, body = call("POST", "/children", {"key": LIKE}, headers)
    assert (status, body["conflict"]) == (409, "superseded")
    assert get(dynamodb, table_name, LIKE) is None
    assert like_tally(dynamodb, table_name) == 0


def test_a_keyed_allocation_repeated_returns_its_number(call, dynamodb, table_name) -> None:
    headers = {"Idempotency-Key": "issue-for-ticket-88"}
    first = call("POST", "/allocations", {"counter": PROJECT, "strategy": "atomic"}, headers)
    again = call("POST", "/allocations", {"counter": PROJECT, "strategy": "atomic"}, headers)
    assert (first[0], first[1]["numbers"], first[1]["replayed"]) == (201, [1], False)
    assert (again[0], again[1]["numbers"], again[1]["replayed"]) == (201, [1], True)
    assert (get(dynamodb, table_name, PROJECT) or {})["lastIssue"] == 1


# --- the OpenAPI document -----------------------------------------------------------------


def test_the_openapi_document_describes_every_route_and_body(call) -> None:
    status, document = call("GET", "/openapi.json", "")
    assert status == 200
    paths = document["paths"]
    assert set(paths["/children"]) == {"post", "delete", "patch"}
    assert set(paths["/allocations"]) == {"post"}
    parameters = paths["/children"]["post"]["parameters"]
    assert {(p["name"], p["in"]) for p in parameters} == {("idempotency-key", "header")}
    schemas = document["components"]["schemas"]
    assert {"AddChild", "ChildKey", "ChangeAmount", "Allocate"} <= set(schemas)
    assert schemas["Allocate"]["properties"]["count"]["maximum"] == 98
    assert {"201", "409", "422"} <= set(paths["/allocations"]["post"]["responses"])
    assert schemas["ChangeAmount"]["properties"]["amount"]["type"] == "number"
