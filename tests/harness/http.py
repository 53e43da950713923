"""API Gateway events for the writer API (HTTP API payload v2 and REST API v1, either with a
base64 body), and JSON text with exact numbers."""

from __future__ import annotations

import base64
import json
import uuid
from decimal import Decimal
from typing import Any

from tally.handlers import writer_api
from tests.utils import lambda_context


def http_event(
    method: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """An HTTP API (payload v2) event; a str body is sent as is, anything else as JSON."""
    request_id = str(uuid.uuid4())
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        # API Gateway lowercases header names in payload v2.
        "headers": {
            "content-type": "application/json",
            **{name.lower(): value for name, value in (headers or {}).items()},
        },
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "api",
            "domainName": "api.example.com",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": "pytest",
            },
            "requestId": request_id,
            "routeKey": "$default",
            "stage": "$default",
            "time": "01/Jan/2025:00:00:00 +0000",
            "timeEpoch": 1735689600000,
        },
        "body": body if isinstance(body, str) else to_json(body),
        "isBase64Encoded": False,
    }


def rest_event(
    method: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """A REST API (payload v1) proxy event; header names as the caller sent them."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": sent,
        "multiValueHeaders": {name: [value] for name, value in sent.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "api",
            "httpMethod": method,
            "path": f"/prod{path}",
            "protocol": "HTTP/1.1",
            "requestId": str(uuid.uuid4()),
            "resourcePath": "/{proxy+}",
            "stage": "prod",
            "identity": {"sourceIp": "127.0.0.1", "userAgent": "pytest"},
        },
        "body": body if isinstance(body, str) else to_json(body),
        "isBase64Encoded": False,
    }


def encoded(event: dict[str, Any]) -> dict[str, Any]:
    """The event as API Gateway sends a binary media type: the body base64-encoded."""
    body = base64.b64encode((event["body"] or "").encode("utf-8", "surrogatepass")).decode()
    return {**event, "body": body, "isBase64Encoded": True}


def invoke_event(event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Call the writer API's handler with this event; (status, parsed JSON body)."""
    response = writer_api.handler(event, lambda_context())
    return response["statusCode"], json.loads(response["body"])


def invoke(
    method: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """Call the writer API's handler as Lambda would; (status, parsed JSON body)."""
    return invoke_event(http_event(method, path, body, headers))


def to_json(value: Any) -> str:
    """JSON text where a Decimal is written as the number it is (``1E+400``, ``NaN``), never
    rounded through a float."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        members = (f"{json.dumps(str(k))}: {to_json(v)}" for k, v in value.items())
        return "{" + ", ".join(members) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(to_json(v) for v in value) + "]"
    return json.dumps(value)
