"""Network faults for a boto3 client, decided per attempt by a seeded RNG.

    faults = Faults(client, lost=0.3, seed=7, operations={"TransactWriteItems"})
    with faults:
        writer.add_child(key)
    faults.stats["TransactWriteItems"]  # OperationStats(calls=1, attempts=2, lost=1, ...)

Three faults, each one botocore's standard retry mode treats as retryable, so botocore
itself resends the same request (same body, same ``ClientRequestToken``, which it fills
once per call):

- ``lost``: the request reaches the service and commits; the response is thrown away and
  the attempt fails with ``ReadTimeoutError`` (a network that drops the answer).
- ``down``: the attempt fails with ``EndpointConnectionError`` before anything is sent.
- ``throttled``: the attempt is answered with the service's throttling error without being
  sent (``ThrottlingException`` for JSON protocols such as DynamoDB and SQS, ``Throttling``
  for query protocols such as SNS).

``lost``, ``down`` and ``throttled`` are per-attempt probabilities (their sum at most 1);
one ``random.Random(seed)`` draws every decision, so a single-threaded run is reproducible.
``operations`` limits faults to those operation names (``None``: every operation);
untargeted calls are still counted. The last attempt botocore will make for a call is never
faulted (``spare_last_attempt``), so every call ends with the service's real answer; set it
to False to let calls fail with the connection error once retries run out.

botocore's retry quota (500 units per client, 10 per timeout retry, refunded only by a
retried call that ends in a 2xx) still applies: under a sustained high loss rate it runs dry
and calls fail with the fault's error, as they would in production; give long runs a fresh
client per phase if that is not what they test.

The client must use botocore's standard retry mode with an explicit ``max_attempts``. The
hook is a ``before-send`` handler on this one client (any service: DynamoDB, SNS, SQS).
While installed, botocore's retry backoff sleeps are skipped for every client in the process
(``instant_retries``): retry decisions, attempt limits and the retry quota stay botocore's,
only the waiting goes, so hundreds of faults fit in a test. Thread-safe.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Any
from unittest import mock

from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError
from botocore.httpsession import URLLib3Session


@dataclass
class OperationStats:
    """What happened to one operation's calls while the harness was installed."""

    calls: int = 0
    attempts: int = 0
    lost: int = 0
    down: int = 0
    throttled: int = 0

    @property
    def faults(self) -> int:
        return self.lost + self.down + self.throttled


class Faults:
    """Injects lost responses, outages and throttling into one client's requests."""

    def __init__(
        self,
        client: Any,
        *,
        lost: float = 0.0,
        down: float = 0.0,
        throttled: float = 0.0,
        seed: int = 0,
        operations: Collection[str] | None = None,
        spare_last_attempt: bool = True,
        instant_retries: bool = True,
    ):
        if min(lost, down, throttled) < 0 or lost + down + throttled > 1:
            raise ValueError("fault rates must be >= 0 and sum to at most 1")
        self.client = client
        self.rates = (lost, down, throttled)
        self.operations = set(operations) if operations is not None else None
        self.spare_last_attempt = spare_last_attempt
        self.instant_retries = instant_retries
        self.stats: dict[str, OperationStats] = {}
        self.backoff_skipped = 0.0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._service = client.meta.service_model.service_id.hyphenize()
        self._protocol = client.meta.service_model.protocol
        retries = client.meta.config.retries or {}
        if retries.get("mode") != "standard" or "total_max_attempts" not in retries:
            raise ValueError(
                "give the client Config(retries={'mode': 'standard', 'max_attempts': N})"
            )
        self._max_attempts = int(retries["total_max_attempts"])
        self._session: URLLib3Session | None = None
        self._patch: Any = None

    # --- installing -------------------------------------------------------------------

    def __enter__(self) -> Faults:
        self._session = URLLib3Session()
        self.client.meta.events.register(f"before-send.{self._service}", self._before_send)
        if self.instant_retries:
            self._patch = mock.patch("botocore.endpoint.time", _NoBackoff(self))
            self._patch.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.client.meta.events.unregister(f"before-send.{self._service}", self._before_send)
        if self._patch is not None:
            self._patch.stop()
            self._patch = None
        if self._session is not None:
            self._session.close()
            self._session = None

    # --- reading the results ----------------------------------------------------------

    def total(self) -> OperationStats:
        total = OperationStats()
        for stats in self.stats.values():
            for field in fields(OperationStats):
                setattr(total, field.name, getattr(total, field.name) + getattr(stats, field.name))
        return total

    def rows(self) -> Iterator[tuple[str, OperationStats]]:
        """(operation, stats) sorted by operation name, for a report table."""
        yield from sorted(self.stats.items())

    # --- the hook -------------------------------------------------------------------------

    def _before_send(
        self, request: AWSPreparedRequest, event_name: str, **_: Any
    ) -> AWSResponse | None:
        operation = event_name.rsplit(".", 1)[-1]
        attempt = _attempt(request)
        with self._lock:
            stats = self.stats.setdefault(operation, OperationStats())
            stats.attempts += 1
            stats.calls += attempt == 1
            fault = self._draw(operation, attempt)
            if fault is not None:
                setattr(stats, fault, getattr(stats, fault) + 1)
        if fault == "lost":
            assert self._session is not None
            response = self._session.send(request)
            _ = response.content  # the service answered; the answer never arrives
            raise ReadTimeoutError(endpoint_url=request.url, error="response lost")
        if fault == "down":
            raise EndpointConnectionError(endpoint_url=request.url, error="service down")
        if fault == "throttled":
            return self._throttling_response(request)
        return None

    def _draw(self, operation: str, attempt: int) -> str | None:
        if self.operations is not None and operation not in self.operations:
            return None
        if self.spare_last_attempt and attempt >= self._max_attempts:
            return None
        draw = self._rng.random()
        for name, rate in zip(("lost", "down", "throttled"), self.rates, strict=True):
            if draw < rate:
                return name
            draw -= rate
        return None

    def _throttling_response(self, request: AWSPreparedRequest) -> AWSResponse:
        if self._protocol == "query":
            body = (
                "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>"
                "<Message>Rate exceeded</Message></Error><RequestId>faults</RequestId>"
                "</ErrorResponse>"
            )
            content_type = "text/xml"
        else:
            body = json.dumps({"__type": "ThrottlingException", "message": "Rate exceeded"})
            content_type = "application/x-amz-json-1.0"
        return AWSResponse(request.url, 400, {"Content-Type": content_type}, _Raw(body.encode()))


def _attempt(request: AWSPreparedRequest) -> int:
    """The attempt number botocore wrote into the ``amz-sdk-request`` header (1-based)."""
    header = request.headers.get("amz-sdk-request", b"attempt=1")
    text = header.decode() if isinstance(header, bytes) else header
    parts = dict(part.strip().split("=", 1) for part in text.split(";") if "=" in part)
    return int(parts.get("attempt", "1"))


class _Raw:
    """The raw-stream shape AWSResponse reads a body from."""

    def __init__(self, body: bytes):
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


class _NoBackoff:
    """``time`` as botocore.endpoint sees it, minus the retry backoff sleep."""

    def __init__(self, faults: Faults):
        self._faults = faults

    def sleep(self, seconds: float) -> None:
        with self._faults._lock:
            self._faults.backoff_skipped += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class Outage:
    """A counted fault on one operation: the first ``times`` attempts fail, then none.

    Where ``Faults`` draws faults at a rate, this breaks a service for a known stretch
    (SNS down for two publishes, one lost response), the way an outage test needs.

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


class Refused:
    """Every attempt at one operation answered with the same error, never sent: the attempts
    (botocore's retries included) are counted, botocore's backoff sleeps skipped.

        with Refused(client, "TransactWriteItems", "TransactionInProgressException") as refused:
            ...
        refused.attempts

    ``fields`` are the error's modelled members (``CancellationReasons``); ``status`` its HTTP
    status. JSON protocols only (DynamoDB).
    """

    def __init__(
        self, client: Any, operation: str, code: str, status: int = 400, **fields: Any
    ) -> None:
        self.client = client
        self.body = json.dumps({"__type": code, "message": f"refused: {code}", **fields})
        self.status = status
        self.attempts = 0
        service = client.meta.service_model.service_id.hyphenize()
        self.event = f"before-send.{service}.{operation}"
        self._patch: Any = None

    def __enter__(self) -> Refused:
        self.client.meta.events.register(self.event, self._before_send)
        self._patch = mock.patch("botocore.endpoint.time", _Unslept())
        self._patch.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.client.meta.events.unregister(self.event, self._before_send)
        self._patch.stop()

    def _before_send(self, request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        self.attempts += 1
        headers = {"Content-Type": "application/x-amz-json-1.0"}
        return AWSResponse(request.url, self.status, headers, _Raw(self.body.encode()))


class _Unslept:
    """``time`` as botocore.endpoint sees it, minus the retry backoff sleep."""

    def sleep(self, seconds: float) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
