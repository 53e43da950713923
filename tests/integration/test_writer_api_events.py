"""The writer API's handler under malformed API Gateway events: REST (v1) and HTTP (v2)
shapes with fields missing, of the wrong type, or base64 that is not. It answers every one
with a status below 500 and never raises."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.handlers import writer_api
from tests.harness.http import encoded, http_event, rest_event, to_json
from tests.integration.test_writer_api import _invoker, put
from tests.integration.test_writer_api_refusals import snapshot
from tests.utils import lambda_context

POST = {"PK": "POST#a91f", "SK": "META"}
LIKE = {"PK": "POST#a91f", "SK": "LIKE#USER#7c20"}

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=10),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
)
bodies = st.one_of(
    st.just(to_json({"key": LIKE})),
    st.just(to_json({"counter": {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}})),
    st.text(max_size=20),
    st.binary(max_size=20).map(lambda b: b.decode("latin-1")),
)
FIELDS_V2 = ["version", "rawPath", "headers", "requestContext", "body", "isBase64Encoded"]
FIELDS_V1 = ["httpMethod", "path", "headers", "multiValueHeaders", "requestContext", "body"]


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    v1 = draw(st.booleans())
    method = draw(st.sampled_from(["POST", "DELETE", "PATCH", "GET", "PUT", "OPTIONS", "post"]))
    path = draw(
        st.sampled_from(["/children", "/allocations", "/openapi.json", "/", "/x/../children"])
    )
    header = draw(st.sampled_from([{}, {"Idempotency-Key": "k1"}, {"Content-Type": "text/plain"}]))
    event = (rest_event if v1 else http_event)(method, path, draw(bodies), header)
    if draw(st.booleans()):
        event = encoded(event)
    for name in draw(st.lists(st.sampled_from(FIELDS_V1 if v1 else FIELDS_V2), max_size=2)):
        if draw(st.booleans()):
            event.pop(name, None)
        else:
            event[name] = draw(junk)
    if draw(st.integers(0, 9)) == 0:
        event["isBase64Encoded"] = draw(junk)
    return event


@pytest.fixture
def call(monkeypatch: pytest.MonkeyPatch, dynamodb_endpoint: str, table_name: str) -> Iterator[Any]:
    yield from _invoker(monkeypatch, dynamodb_endpoint, table_name)


def test_malformed_events_of_either_shape_never_raise_nor_get_a_5xx(
    call, dynamodb, table_name
) -> None:
    put(dynamodb, table_name, {**POST, "likeTally": Decimal(0)})
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(events())
    def run(event: dict[str, Any]) -> None:
        before = snapshot(dynamodb, table_name)
        response = writer_api.handler(event, lambda_context())
        status = response["statusCode"]
        statuses[status] += 1
        assert status < 500, (event, response)
        if status >= 400:
            assert snapshot(dynamodb, table_name) == before, event

    run()
    print(f"\n[events] statuses: {dict(sorted(statuses.items()))}")
    assert {201, 400, 422} <= set(statuses)
