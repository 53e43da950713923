"""The writer API's OpenAPI document says how to call it: IAM auth (SigV4) on every operation,
in the scheme SAM writes into the API it builds from template.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.http import http_event, invoke_event, rest_event
from tests.harness.iam import expand

# OpenAPI's methods, and API Gateway's extension for any method (SAM's `/{proxy+}` route).
METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"} | {
    "x-amazon-apigateway-any-method"
}
SIGV4 = {
    "type": "apiKey",
    "in": "header",
    "name": "Authorization",
    "x-amazon-apigateway-authtype": "awsSigv4",
}


def operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (path, method): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    }


def required(document: dict[str, Any], operation: dict[str, Any]) -> list[dict[str, list[str]]]:
    """The security an operation requires: its own, else the document's (OpenAPI 3.1)."""
    requirement: list[dict[str, list[str]]] = operation.get("security", document.get("security"))
    return requirement or []


@pytest.mark.parametrize("event", [http_event, rest_event], ids=["http api v2", "rest api v1"])
def test_every_operation_requires_the_apis_iam_auth(event: Any) -> None:
    status, document = invoke_event(event("GET", "/openapi.json", ""))
    assert status == 200
    schemes = document["components"]["securitySchemes"]
    assert {k: v for k, v in schemes["AWS_IAM"].items() if k != "description"} == SIGV4
    assert document["security"] == [{"AWS_IAM": []}]
    found = operations(document)
    assert len(found) == 5, sorted(found)  # the five write routes
    for where, operation in found.items():
        assert required(document, operation) == [{"AWS_IAM": []}], where


def test_the_scheme_is_the_one_sam_gives_the_deployed_api() -> None:
    """What API Gateway is told (SAM's OpenAPI for WriterApi) and what callers are told agree."""
    body = expand({})["Resources"]["WriterApi"]["Properties"]["Body"]
    status, document = invoke_event(http_event("GET", "/openapi.json", ""))
    assert status == 200
    deployed = [required(body, operation) for operation in operations(body).values()]
    assert deployed == [[{"AWS_IAM": []}]]  # SAM's one route, `ANY /{proxy+}`
    ours = document["components"]["securitySchemes"]["AWS_IAM"]
    assert {k: v for k, v in ours.items() if k != "description"} == (
        body["components"]["securitySchemes"]["AWS_IAM"]
    )
