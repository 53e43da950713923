"""HTTP API over the transactional writers (API Gateway HTTP API, payload v2).

Routes: ``POST /children`` (add), ``DELETE /children`` (remove), ``PATCH /children``
(change a sum child's amount), ``POST /allocations`` (hand out sequence numbers).
The ``Idempotency-Key`` header becomes the transaction's idempotency token.
"""

from __future__ import annotations

import json
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal, TypeVar

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tally.aws import dynamodb_client
from tally.observability import logger, metrics, tracer
from tally.rules import load_rules
from tally.settings import settings
from tally.writers import (
    CounterBehindError,
    InvalidCounterError,
    ParentNotFoundError,
    SequenceAllocator,
    TallyWriter,
)
from tally.writers.sequences import MAX_BLOCK, Strategy

app = APIGatewayHttpResolver()
M = TypeVar("M", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChildKey(_Body):
    key: dict[str, str]


class AddChild(ChildKey):
    attributes: dict[str, Any] = Field(default_factory=dict)


class ChangeAmount(ChildKey):
    amount: Decimal = Field(allow_inf_nan=False)


class Allocate(_Body):
    counter: dict[str, str]
    strategy: Strategy = "gapless"
    count: int = Field(default=1, ge=1, le=MAX_BLOCK)
    attributes: dict[str, Any] = Field(default_factory=dict)
    member_key: dict[str, str] | None = None


class BadRequest(Exception):
    """The body is not what the route needs; the message names the field."""


@lru_cache(maxsize=1)
def _writers() -> tuple[TallyWriter, SequenceAllocator]:
    rules = load_rules(settings().rules_file)
    client = dynamodb_client()
    table = settings().table_name
    return TallyWriter(client, table, rules), SequenceAllocator(client, table, rules)


def _body(model: type[M]) -> M:
    raw = app.current_event.decoded_body
    try:
        # Numbers stay Decimal from the wire to DynamoDB.
        data = json.loads(raw or "", parse_float=Decimal)
    except json.JSONDecodeError as error:
        raise BadRequest(f"body is not JSON: {error.msg}") from None
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "body"
        raise BadRequest(f"field {field!r}: {first['msg']}") from None


def _idempotency_key() -> str | None:
    return app.current_event.headers.get("idempotency-key") or None


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


@app.post("/children")
@tracer.capture_method
def add_child() -> Response[str]:
    body = _body(AddChild)
    result = _writers()[0].add_child(body.key, body.attributes, idempotency_key=_idempotency_key())
    return _outcome(result.outcome, result.replayed)


@app.delete("/children")
@tracer.capture_method
def remove_child() -> Response[str]:
    body = _body(ChildKey)
    result = _writers()[0].remove_child(body.key, idempotency_key=_idempotency_key())
    return _outcome(result.outcome, result.replayed)


@app.patch("/children")
@tracer.capture_method
def change_amount() -> Response[str]:
    body = _body(ChangeAmount)
    result = _writers()[0].change_amount(body.key, body.amount, idempotency_key=_idempotency_key())
    return _outcome(result.outcome, result.replayed)


@app.post("/allocations")
@tracer.capture_method
def allocate() -> Response[str]:
    body = _body(Allocate)
    allocation = _writers()[1].allocate(
        body.counter,
        strategy=body.strategy,
        count=body.count,
        attributes=body.attributes,
        member_key=body.member_key,
    )
    outcome: Literal["created", "already_present"] = (
        "created" if allocation.outcome == "allocated" else "already_present"
    )
    return _outcome(
        outcome,
        False,
        numbers=list(allocation.numbers),
        member_keys=list(allocation.member_keys),
        retries=allocation.retries,
    )


@app.exception_handler(BadRequest)
@app.exception_handler(ValueError)
def _bad_request(error: Exception) -> Response[str]:
    return _json(400, {"error": str(error)})


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
