"""HTTP API over the transactional writers (API Gateway HTTP API payload v2, or REST API /
payload v1; a body flagged ``isBase64Encoded`` is decoded first).

Routes: ``POST /children`` (add), ``DELETE /children`` (remove), ``PATCH /children``
(change a sum child's amount), ``PATCH /children/index`` (move a child found through an
index to another parent or status), ``POST /allocations`` (hand out sequence numbers),
``GET /openapi.json`` (this API's OpenAPI document, which requires IAM auth of every route).

Powertools' event handler validates each body against the pydantic models below; the
writers then check what only they know (the rules, DynamoDB's limits). A request refused
for its content is a 422 naming the field: ``{"statusCode": 422, "detail": [{"loc", "type",
"msg"}]}``; a body that cannot be decoded is a 400; a counter a writer may not build on is a
409 naming the attribute. Every refusal writes nothing, and every error body stays under
4 KB (long names and messages are cut, marked). The ``Idempotency-Key`` header (1..255
characters) makes a request safe to repeat: the same key and body answer the first outcome
with ``"replayed": true``; the same key with another body is a 422 on the header; a key
whose write has since been undone is a 409. On a Global Table, a write to a parent homed in
another Region (``tallyHome``) is a 409 naming ``home``. docs/writers.md states the contract.
"""

# No `from __future__ import annotations`: Powertools reads the routes' parameter types at
# runtime, through the tracer's wrapper, whose globals cannot resolve string annotations.
import base64
import binascii
import json
from decimal import Decimal
from functools import lru_cache
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import (
    APIGatewayHttpResolver,
    APIGatewayRestResolver,
    Response,
    content_types,
)
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Header
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from tally.core.aws import dynamodb_client
from tally.core.observability import logger, metrics, tracer
from tally.core.settings import settings
from tally.handlers.writer_openapi import openapi_document
from tally.rules import load_rules
from tally.writers import (
    CounterBehindError,
    IdempotencyConflictError,
    InvalidCounterError,
    InvalidRequestError,
    ParentHomedElsewhereError,
    ParentNotFoundError,
    SequenceAllocator,
    TallyWriter,
    WriteResult,
)
from tally.writers.allocations import MAX_BLOCK, Strategy
from tally.writers.idempotency import MAX_KEY_LENGTH


def _parse_json(text: str) -> Any:
    """JSON with every number a Decimal (no float, no 4,300-digit int limit); NaN and Infinity
    arrive as Decimals for the writers to refuse by name, and nesting too deep for the
    parser is a decode error."""
    try:
        return json.loads(text, parse_float=Decimal, parse_int=Decimal, parse_constant=Decimal)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None


# One set of routes, served to HTTP API (payload v2) and REST API (payload v1) events alike.
app = Router()  # type: ignore[no-untyped-call]


def _json_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, Decimal | int):
        raise ValueError("must be a JSON number")
    return value


# JSON numbers only: no strings, no booleans, though pydantic's lax mode would take them.
Number = Annotated[Decimal, BeforeValidator(_json_number), WithJsonSchema({"type": "number"})]
Count = Annotated[int, Field(ge=1, le=MAX_BLOCK), BeforeValidator(_json_number)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="idempotency-key",
        min_length=1,
        max_length=MAX_KEY_LENGTH,
        description="Makes the request safe to repeat for a day: same key, same outcome.",
    ),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChildKey(_Body):
    key: dict[str, str] = Field(description="The child's primary key, e.g. PK and SK.")


class AddChild(ChildKey):
    attributes: dict[str, Any] = Field(
        default_factory=dict, description="The child's other attributes (a sum child's amount)."
    )


class ChangeAmount(ChildKey):
    amount: Number = Field(description="The sum child's new amount.")


class MoveChild(ChildKey):
    attributes: dict[str, Any] = Field(
        description="The child's index key attributes to set (null removes one), e.g. "
        '{"GSI1PK": "USER#cat"} or {"GSI1SK": "MUTED#2026-11-26"}.'
    )


class Allocate(_Body):
    counter: dict[str, str] = Field(description="The sequence counter's primary key.")
    strategy: Strategy = "gapless"
    count: Count = Field(default=1, description="Numbers to hand out (block only).")
    attributes: dict[str, Any] = Field(
        default_factory=dict, description="Attributes every new member gets."
    )
    member_key: dict[str, str] | None = Field(
        default=None, description="The member's natural key (index-layout sequences)."
    )


@lru_cache(maxsize=1)
def _writers() -> tuple[TallyWriter, SequenceAllocator]:
    env = settings()
    rules = load_rules(env.rules_file)
    client = dynamodb_client()
    table = env.table_name
    # On a Global Table every write leaves its Region's evidence (docs/global-tables.md).
    region = env.aws_region if env.regions() else None
    return (
        TallyWriter(client, table, rules, region=region),
        SequenceAllocator(client, table, rules, region=region),
    )


def _json(status: int, body: dict[str, Any]) -> Response[str]:
    if status >= 400:
        body = _bounded(body)
    return Response(status, content_types.APPLICATION_JSON, json.dumps(body, default=str))


# An error body names the field and says why in a few KB, whatever the request held.
_MAX_TEXT, _MAX_LOC_PART, _MAX_LOC, _MAX_ERRORS, _MAX_BODY = 512, 64, 40, 8, 4096


def _cut(value: Any, limit: int) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}...[{len(value) - limit} more characters]"
    return value


def _shrink(value: Any, limit: int) -> Any:
    """Strings cut to ``limit`` characters (a ``loc``'s parts and names to
    ``_MAX_LOC_PART``), lists to ``_MAX_LOC`` items, at every depth."""
    if isinstance(value, dict):
        return {
            _cut(str(k), _MAX_LOC_PART): _shrink(v, _MAX_LOC_PART if k == "loc" else limit)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_shrink(v, limit) for v in list(value)[:_MAX_LOC]]
    return _cut(value, limit)


def _bounded(body: dict[str, Any]) -> dict[str, Any]:
    """The error body with long strings cut and long lists shortened, under ``_MAX_BODY``."""
    bounded: dict[str, Any] = _shrink(body, _MAX_TEXT)
    detail = bounded.get("detail")
    if isinstance(detail, list):
        del detail[_MAX_ERRORS:]
        while len(json.dumps(bounded, default=str)) > _MAX_BODY and len(detail) > 1:
            detail.pop()
    if len(json.dumps(bounded, default=str)) > _MAX_BODY:
        smaller: dict[str, Any] = _shrink(bounded, 128)
        return smaller
    return bounded


_STATUS = {
    "created": 201,
    "already_present": 409,
    "removed": 200,
    "not_present": 404,
    "changed": 200,
    "unchanged": 200,
}


def _outcome(outcome: str, replayed: bool, **extra: Any) -> Response[str]:
    metrics.add_metric(name=f"Writes_{outcome}", unit=MetricUnit.Count, value=1)
    return _json(_STATUS[outcome], {"outcome": outcome, "replayed": replayed, **extra})


def _tally() -> TallyWriter:
    return _writers()[0]


def _written(result: WriteResult) -> Response[str]:
    return _outcome(result.outcome, result.replayed)


_REFUSED: OpenAPIResponse = {"description": "Refused; `detail` names each field and why."}
_CHILD_RESPONSES: dict[int, OpenAPIResponse] = {
    404: {"description": "The parent does not exist, or (remove, change) the child does not."},
    409: {
        "description": "Already present, an invalid counter or stored amount, a superseded "
        "key, or (a Global Table) a parent homed in another Region (`home` names it)."
    },
    422: _REFUSED,
}


@app.post(
    "/children",
    summary="Add a child and count it",
    responses={201: {"description": "Created (or replayed)."}, **_CHILD_RESPONSES},
)
@tracer.capture_method
def add_child(body: AddChild, idempotency_key: IdempotencyKey = None) -> Response[str]:
    result = _tally().add_child(body.key, body.attributes, idempotency_key=idempotency_key)
    return _written(result)


@app.delete("/children", summary="Remove a child and uncount it", responses=_CHILD_RESPONSES)
@tracer.capture_method
def remove_child(body: ChildKey, idempotency_key: IdempotencyKey = None) -> Response[str]:
    return _written(_tally().remove_child(body.key, idempotency_key=idempotency_key))


@app.patch(
    "/children", summary="Change a sum child's amount and the total", responses=_CHILD_RESPONSES
)
@tracer.capture_method
def change_amount(body: ChangeAmount, idempotency_key: IdempotencyKey = None) -> Response[str]:
    result = _tally().change_amount(body.key, body.amount, idempotency_key=idempotency_key)
    return _written(result)


@app.patch(
    "/children/index",
    summary="Move a child found through an index to another parent or status",
    responses=_CHILD_RESPONSES,
)
@tracer.capture_method
def move_child(body: MoveChild, idempotency_key: IdempotencyKey = None) -> Response[str]:
    result = _tally().move_child(body.key, body.attributes, idempotency_key=idempotency_key)
    return _written(result)


@app.post(
    "/allocations",
    summary="Hand out sequence numbers and write their members",
    responses={
        201: {"description": "Allocated (or replayed)."},
        409: {
            "description": "The natural key exists already, the counter is behind, or (a "
            "Global Table) the counter is homed in another Region (`home` names it)."
        },
        422: _REFUSED,
    },
)
@tracer.capture_method
def allocate(body: Allocate, idempotency_key: IdempotencyKey = None) -> Response[str]:
    allocation = _writers()[1].allocate(
        body.counter,
        strategy=body.strategy,
        count=body.count,
        attributes=body.attributes,
        member_key=body.member_key,
        idempotency_key=idempotency_key,
    )
    outcome: Literal["created", "already_present"] = (
        "created" if allocation.outcome == "allocated" else "already_present"
    )
    return _outcome(
        outcome,
        allocation.replayed,
        numbers=list(allocation.numbers),
        member_keys=list(allocation.member_keys),
        retries=allocation.retries,
    )


@app.get("/openapi.json", include_in_schema=False)
def openapi() -> Response[str]:
    return Response(200, content_types.APPLICATION_JSON, openapi_document(_http))


def _unprocessable(*errors: dict[str, Any]) -> Response[str]:
    return _json(422, {"statusCode": 422, "detail": list(errors)})


@app.exception_handler(RequestValidationError)
def _invalid_body(error: RequestValidationError) -> Response[str]:
    # Field, error type and message; never the input, which may be large or personal.
    fields = [{k: e.get(k) for k in ("loc", "type", "msg")} for e in error.errors()]
    return _unprocessable(*fields)


@app.exception_handler(InvalidRequestError)
def _invalid_request(error: InvalidRequestError) -> Response[str]:
    where = ["header", "idempotency-key"] if error.field == ("idempotency_key",) else ["body"]
    loc = where if where[0] == "header" else [*where, *error.field]
    return _unprocessable({"loc": loc, "type": "value_error", "msg": str(error)})


@app.exception_handler(IdempotencyConflictError)
def _idempotency_conflict(error: IdempotencyConflictError) -> Response[str]:
    if error.reason == "mismatch":
        # A key reused for a different request (the IETF Idempotency-Key draft's 422).
        loc = ["header", "idempotency-key"]
        return _unprocessable({"loc": loc, "type": "idempotency_key_reused", "msg": str(error)})
    return _json(409, {"error": str(error), "conflict": error.reason})


@app.exception_handler(ParentNotFoundError)
def _parent_missing(error: ParentNotFoundError) -> Response[str]:
    return _json(404, {"error": str(error), "key": error.key})


@app.exception_handler(ParentHomedElsewhereError)
def _homed_elsewhere(error: ParentHomedElsewhereError) -> Response[str]:
    # Not the client's mistake, nor a fault: this Region may not change that parent; the
    # caller sends the write to the writer API of ``home`` (docs/global-tables.md).
    body = {
        "error": str(error),
        "conflict": "homed_elsewhere",
        "home": error.home,
        "key": error.key,
    }
    return _json(409, body)


@app.exception_handler(InvalidCounterError)
def _invalid_counter(error: InvalidCounterError) -> Response[str]:
    logger.warning("counter refused the write", extra={"error": str(error)[:_MAX_TEXT]})
    body = {"error": str(error), "attribute": error.attribute, "key": error.key}
    return _json(409, body)


@app.exception_handler(CounterBehindError)
def _counter_behind(error: CounterBehindError) -> Response[str]:
    logger.warning("counter refused the write", extra={"error": str(error)[:_MAX_TEXT]})
    return _json(409, {"error": str(error)})


_http = APIGatewayHttpResolver(enable_validation=True, json_body_deserializer=_parse_json)
_rest = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=_parse_json)
_http.include_router(app)
_rest.include_router(app)


def _bad_request(message: str) -> dict[str, Any]:
    """A 400 in the shape both payload versions accept, for an event no route can read."""
    detail = [{"loc": ["body"], "type": "bad_request", "msg": message}]
    return {
        "statusCode": 400,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": json.dumps({"statusCode": 400, "detail": detail}),
        "isBase64Encoded": False,
    }


def _decoded(event: dict[str, Any]) -> dict[str, Any] | str:
    """The event with a base64 body decoded to its UTF-8 text, or what is wrong with it."""
    body = event.get("body")
    if not event.get("isBase64Encoded") or body is None:
        return event
    try:
        text = base64.b64decode(body, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return "the body is flagged isBase64Encoded but is not base64 of UTF-8 text"
    return {**event, "body": text, "isBase64Encoded": False}


def _strings(value: Any, of_lists: bool = False) -> bool:
    """Whether ``value`` is absent or a map of strings to strings (or to lists of them)."""
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    if of_lists:
        return all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(i, str) for i in v)
            for k, v in value.items()
        )
    return all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _malformed(event: dict[str, Any]) -> str | None:
    """What in the event's fields the router reads is not of API Gateway's types, if any."""
    for name in ("headers", "queryStringParameters", "pathParameters", "stageVariables"):
        if not _strings(event.get(name)):
            return f"the event's {name} is not a map of strings"
    for name in ("multiValueHeaders", "multiValueQueryStringParameters"):
        if not _strings(event.get(name), of_lists=True):
            return f"the event's {name} is not a map of string lists"
    cookies = event.get("cookies")
    if cookies is not None and not (
        isinstance(cookies, list) and all(isinstance(c, str) for c in cookies)
    ):
        return "the event's cookies are not a list of strings"
    for name in ("body", "rawQueryString"):
        if event.get(name) is not None and not isinstance(event[name], str):
            return f"the event's {name} is not a string"
    if event.get("isBase64Encoded") not in (None, True, False):
        return "the event's isBase64Encoded is not a boolean"
    return None


def _resolver(event: Any) -> APIGatewayHttpResolver | APIGatewayRestResolver | None:
    if not isinstance(event, dict) or not isinstance(event.get("requestContext"), dict):
        return None
    context = event["requestContext"]
    http = context.get("http")
    if (
        event.get("version") == "2.0"
        and isinstance(http, dict)
        and isinstance(http.get("method"), str)
        and isinstance(event.get("rawPath"), str)
    ):
        return _http
    if isinstance(event.get("httpMethod"), str) and isinstance(event.get("path"), str):
        return _rest
    return None


@logger.inject_lambda_context(correlation_id_path="requestContext.requestId")
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    resolver = _resolver(event)
    if resolver is None:
        return _bad_request("not an API Gateway HTTP API (v2) or REST API (v1) proxy event")
    malformed = _malformed(event)
    if malformed is not None:
        return _bad_request(malformed)
    decoded = _decoded(event)
    if isinstance(decoded, str):
        return _bad_request(decoded)
    return resolver.resolve(decoded, context)
