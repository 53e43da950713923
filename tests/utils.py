"""Helpers shared by the tests: a Lambda context, item conversions, stream records."""

from __future__ import annotations

import itertools
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from tally.local.runner import LocalContext

_ser, _de = TypeSerializer(), TypeDeserializer()


def lambda_context(name: str = "tally-test") -> LocalContext:
    """The context local mode passes to handlers (the attributes Powertools reads)."""
    return LocalContext(name)


def serialize(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _ser.serialize(v) for k, v in item.items()}


def deserialize(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _de.deserialize(v) for k, v in item.items()}


TTL_IDENTITY = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
_sequence = itertools.count(1000)


def stream_record(
    event: str,
    keys: dict[str, str],
    new: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    *,
    seq: str | None = None,
    at: int = 1_700_000_000,
    identity: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A DynamoDB stream record in Lambda's shape; images include the keys, as DynamoDB's do."""
    stream: dict[str, Any] = {
        "Keys": serialize(keys),
        "SequenceNumber": seq or str(next(_sequence)),
        "ApproximateCreationDateTime": at,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    if new is not None:
        stream["NewImage"] = serialize({**keys, **new})
    if old is not None:
        stream["OldImage"] = serialize({**keys, **old})
    body: dict[str, Any] = {
        "eventID": f"ev-{stream['SequenceNumber']}",
        "eventName": event,
        "eventSource": "aws:dynamodb",
        "dynamodb": stream,
    }
    if identity is not None:
        body["userIdentity"] = identity
    return body
