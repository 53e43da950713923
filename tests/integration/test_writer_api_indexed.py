"""The writer API on children found through an index: follow edges and cart lines through the
real handler, on a DynamoDB Local table with the rules' indexes."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.test_writer_api import _invoker
from tests.integration.test_writers_indexed import (  # noqa: F401 (the table fixture)
    FOLLOWERS,
    FOLLOWING,
    TOTALS,
    counted,
    counter,
    edge,
    follows,
    put,
    read,
    scan,
    table,
    user,
)

# The rules of test_writers_indexed.py, as the API's rules file.
RULES_TOML = """
[[rules]]
name = "followers"
kind = "count"
parent = { PK = "USER#*", SK = "PROFILE" }
children = { PK = "USER#*", SK = "FOLLOWS#*" }
counter = "followerCount"
revision = "rev"
repair = "auto"
[rules.through]
index = "GSI1"
partition_key = "GSI1PK"
sort_key = "GSI1SK"
sort_prefix = "FOLLOWING#"

[[rules]]
name = "product-totals"
kind = "sum"
parent = { PK = "PRODUCT#*", SK = "TOTAL" }
children = { PK = "CART#*", SK = "LINE#*" }
counter = "quantity"
summed = "units"
revision = "rev"
through = { index = "GSI2", partition_key = "GSI2PK", sort_key = "GSI2SK" }

[[rules]]
name = "likes"
kind = "count"
parent = { PK = "POST#*", SK = "META" }
children = { SK = "LIKE#*" }
counter = "likeCount"
"""


@pytest.fixture
def call(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
    dynamodb: Any,
    dynamodb_endpoint: str,
    table: str,  # noqa: F811
) -> Iterator[Any]:
    rules = Path(tmp_path_factory.mktemp("rules")) / "rules.toml"
    rules.write_text(RULES_TOML)
    for name in ("bob", "cat"):
        put(dynamodb, table, {**user(name), "followerCount": 0})
    put(dynamodb, table, {"PK": "PRODUCT#a", "SK": "TOTAL", "quantity": 0})
    yield from _invoker(monkeypatch, dynamodb_endpoint, table, rules)


def test_follow_re_parent_unfollow_by_status_and_remove_through_the_api(
    call: Any,
    dynamodb: Any,
    table: str,  # noqa: F811
) -> None:
    ann = edge("ann", "x")
    assert call("POST", "/children", {"key": ann, "attributes": follows("bob")})[0] == 201
    assert call("POST", "/children", {"key": ann, "attributes": follows("bob")})[0] == 409
    status, body = call("PATCH", "/children/index", {"key": ann, "attributes": follows("cat")})
    assert (status, body) == (200, {"outcome": "changed", "replayed": False})
    assert counter(dynamodb, table, user("bob"), "followerCount") == 0
    assert counter(dynamodb, table, user("cat"), "followerCount") == 1
    status, body = call("PATCH", "/children/index", {"key": ann, "attributes": {"GSI1SK": None}})
    assert (status, body["outcome"]) == (200, "changed")
    assert read(dynamodb, table, ann) == {**ann, "GSI1PK": "USER#cat"}
    assert counter(dynamodb, table, user("cat"), "followerCount") == 0
    status, body = call("PATCH", "/children/index", {"key": ann, "attributes": {"GSI1SK": None}})
    assert (status, body["outcome"]) == (200, "unchanged")
    assert call("DELETE", "/children", {"key": ann})[0] == 200
    assert call("DELETE", "/children", {"key": ann})[0] == 404
    status, body = call("PATCH", "/children/index", {"key": ann, "attributes": follows("cat")})
    assert (status, body["outcome"]) == (404, "not_present")


@pytest.mark.parametrize(
    ("method", "path", "request_body", "status", "loc"),
    [
        ("POST", "/children", {"key": edge("ann", "x")}, 422, ["body", "attributes", "GSI1PK"]),
        (
            "POST",
            "/children",
            {"key": edge("ann", "x"), "attributes": follows("bob", "MUTED#1")},
            422,
            ["body", "attributes", "GSI1SK"],
        ),
        (
            "POST",
            "/children",
            {"key": edge("ann", "x"), "attributes": {"GSI1PK": "TEAM#b", "GSI1SK": FOLLOWING}},
            422,
            ["body", "attributes", "GSI1PK"],
        ),
        (
            "POST",
            "/children",
            {
                "key": {"PK": "CART#1", "SK": "LINE#1"},
                "attributes": {"GSI2PK": "PRODUCT#a", "GSI2SK": Decimal(5), "units": 1},
            },
            422,
            ["body", "attributes", "GSI2SK"],
        ),
        (
            "PATCH",
            "/children/index",
            {"key": edge("ann", "x"), "attributes": {"GSI1PK": ""}},
            422,
            ["body", "attributes", "GSI1PK"],
        ),
        (
            "PATCH",
            "/children/index",
            {"key": {"PK": "POST#1", "SK": "LIKE#a"}, "attributes": {"GSI1PK": "USER#bob"}},
            422,
            ["body", "key"],
        ),
        (
            "PATCH",
            "/children/index",
            {"key": edge("ann", "x"), "attributes": {"tags": ["a"]}},
            422,
            ["body", "attributes", "tags"],
        ),
        (
            "POST",
            "/children",
            {"key": edge("ann", "x"), "attributes": follows("nobody")},
            404,
            None,
        ),
    ],
)
def test_an_index_child_the_writer_refuses_is_a_4xx_naming_the_field_and_writes_nothing(
    call: Any,
    dynamodb: Any,
    table: str,  # noqa: F811
    method: str,
    path: str,
    request_body: dict[str, Any],
    status: int,
    loc: list[str] | None,
) -> None:
    before = scan(dynamodb, table)
    answered, body = call(method, path, request_body)
    assert answered == status, body
    if loc is not None:
        assert body["detail"][0]["loc"] == loc
    assert scan(dynamodb, table) == before


INDEX_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(["", "USER#bob", "USER#cat", "USER#nobody", "TEAM#x", FOLLOWING, "MUTED#"]),
    st.text(max_size=6),
    st.lists(st.text(max_size=2), max_size=2),
)
ATTRIBUTES = st.dictionaries(
    st.sampled_from(["GSI1PK", "GSI1SK", "GSI2PK", "PK", "note"]), INDEX_VALUES, max_size=3
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["POST", "PATCH", "DELETE"]),
            st.sampled_from(["x", "y"]),
            ATTRIBUTES,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_generated_index_writes_never_answer_5xx_and_keep_the_followees_exact(
    call: Any,
    dynamodb: Any,
    table: str,  # noqa: F811
    steps: list[tuple[str, str, dict[str, Any]]],
) -> None:
    for method, followee, attributes in steps:
        body: dict[str, Any] = {"key": edge("ann", followee)}
        path = "/children/index" if method == "PATCH" else "/children"
        if method != "DELETE":
            body["attributes"] = attributes
        before = scan(dynamodb, table)
        status, answer = call(method, path, body)
        assert status < 500, answer
        if status >= 400:
            assert scan(dynamodb, table) == before
    truth = counted(dynamodb, table, FOLLOWERS)
    for name in ("bob", "cat"):
        assert counter(dynamodb, table, user(name), "followerCount") == truth[f"USER#{name}"]
    assert counted(dynamodb, table, TOTALS) == {}


def test_the_openapi_document_describes_the_move_route(call: Any) -> None:
    status, document = call("GET", "/openapi.json", "")
    assert status == 200
    assert set(document["paths"]["/children/index"]) == {"patch"}
    assert {"404", "409", "422"} <= set(document["paths"]["/children/index"]["patch"]["responses"])
    assert "attributes" in document["components"]["schemas"]["MoveChild"]["required"]
