"""Helpers shared by the tests: a Lambda context, item conversions, stream records, outages."""

from __future__ import annotations

import itertools
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError
from botocore.httpsession import URLLib3Session

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


class Outage:
    """Breaks one operation of a boto3 client, the way a network or a service fails.

    ``down``: the request never leaves (the service is unreachable).
    ``lost``: the request reaches the service and is handled, then the response is lost on
    the way back; the client's own retry policy decides whether it is sent again.
    ``times`` bounds how many attempts fail (None: until ``heal()``); ``calls`` counts them.
    """

    def __init__(self, client: Any, operation: str, mode: str, times: int | None = None):
        self.client, self.mode, self.times = client, mode, times
        service = client.meta.service_model.service_id.hyphenize()
        self.event = f"before-send.{service}.{operation}"
        self.calls = 0
        self.failed = 0
        client.meta.events.register(self.event, self._before_send)

    def _before_send(self, request: Any, **_: Any) -> None:
        self.calls += 1
        if self.times is not None and self.failed >= self.times:
            return None
        self.failed += 1
        if self.mode == "lost":
            URLLib3Session().send(request)
            raise ConnectionClosedError(endpoint_url=request.url)
        raise EndpointConnectionError(endpoint_url=request.url)

    def heal(self) -> None:
        self.client.meta.events.unregister(self.event, self._before_send)
