"""HTTP API over the transactional writers (API Gateway HTTP API, payload v2).

Routes: ``POST /children`` (add), ``DELETE /children`` (remove), ``PATCH /children``
(change a sum child's amount), ``POST /allocations`` (hand out sequence numbers),
``GET /openapi.json`` (this API's OpenAPI document).

Powertools' event handler validates each body against the pydantic models below; the
writers then check what only they know (the rules, DynamoDB's limits). Every refusal is a
422 naming the field: ``{"statusCode": 422, "detail": [{"loc", "type", "msg"}]}``. The
``Idempotency-Key`` header (1..255 characters) makes a request safe to repeat: the same key
and body answer the first outcome with ``"replayed": true``; the same key with another body
is a 422 on the header; a key whose write has since been undone is a 409.
"""

# No `from __future__ import annotations`: Powertools reads the routes' parameter types at
# runtime, through the tracer's wrapper, whose globals cannot resolve string annotations.
import json
from decimal import Decimal
from functools import lru_cache
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Header
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from tally.aws import dynamodb_client
from tally.observability import logger, metrics, tracer
from tally.rules import load_rules
from tally.settings import settings
from tally.writers import (
    CounterBehindError,
    IdempotencyConflictError,
    InvalidCounterError,
    InvalidRequestError,
    ParentNotFoundError,
    SequenceAllocator,
    TallyWriter,
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


app = APIGatewayHttpResolver(enable_validation=True, json_body_deserializer=_parse_json)


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
    rules = load_rules(settings().rules_file)
    client = dynamodb_client()
    table = settings().table_name
    return TallyWriter(client, table, rules), SequenceAllocator(client, table, rules)


def _json(status: int, body: dict[str, Any]) -> Response[str]:
    return Response(status, content_types.APPLICATION_JSON, json.dumps(body, default=str))


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


_REFUSED: OpenAPIResponse = {"description": "Refused; `detail` names each field and why."}
_CHILD_RESPONSES: dict[int, OpenAPIResponse] = {
    404: {"description": "The parent does not exist, or (remove, change) the child does not."},
    409: {"description": "Already present, an invalid counter, or a superseded key."},
    422: _REFUSED,
}


@app.post(
    "/children",
    summary="Add a child and count it",
    responses={201: {"description": "Created (or replayed)."}, **_CHILD_RESPONSES},
)
@tracer.capture_method
def add_child(body: AddChild, idempotency_key: IdempotencyKey = None) -> Response[str]:
    result = _writers()[0].add_child(body.key, body.attributes, idempotency_key=idempotency_key)
    return _outcome(result.outcome, result.replayed)


@app.delete("/children", summary="Remove a child and uncount it", responses=_CHILD_RESPONSES)
@tracer.capture_method
def remove_child(body: ChildKey, idempotency_key: IdempotencyKey = None) -> Response[str]:
    result = _writers()[0].remove_child(body.key, idempotency_key=idempotency_key)
    return _outcome(result.outcome, result.replayed)


@app.patch(
    "/children", summary="Change a sum child's amount and the total", responses=_CHILD_RESPONSES
)
@tracer.capture_method
def change_amount(body: ChangeAmount, idempotency_key: IdempotencyKey = None) -> Response[str]:
    writer = _writers()[0]
    result = writer.change_amount(body.key, body.amount, idempotency_key=idempotency_key)
    return _outcome(result.outcome, result.replayed)


@app.post(
    "/allocations",
    summary="Hand out sequence numbers and write their members",
    responses={
        201: {"description": "Allocated (or replayed)."},
        409: {"description": "The natural key exists already, or the counter is behind."},
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
    schema = app.get_openapi_json_schema(title="tally writers", version="1.0.0")
    return Response(200, content_types.APPLICATION_JSON, schema)


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


@app.exception_handler(InvalidCounterError)
@app.exception_handler(CounterBehindError)
def _conflict(error: Exception) -> Response[str]:
    logger.warning("counter refused the write", extra={"error": str(error)})
    return _json(409, {"error": str(error)})


@logger.inject_lambda_context(correlation_id_path="requestContext.requestId")
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
