"""Lambda's DynamoDB stream trigger, played locally: a shard's records to the handler, as the
event source mapping template.yaml declares delivers them.

It honours the mapping's settings: batches up to the batch size, partial batch responses
(retry from the first failed record), bisection on a function error, a retry limit, and the
on-failure queue after it. With a ParallelizationFactor N above 1 it runs up to N batches of
one shard at once, as Lambda does: each record goes to a lane chosen by its item's key
(partition and sort key), so one item's records stay in order while two items of one item
collection may be verified in concurrent batches, in either order.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from tally.core.streams import StreamReader
from tally.core.timefmt import epoch_iso, iso
from tally.local.sqs_trigger import Invoke, Outage, failed_identifiers


@dataclass(frozen=True)
class MappingSettings:
    """The event source mapping's behaviour, as template.yaml declares it."""

    batch_size: int = 100
    window_seconds: float = 0.0
    max_retries: int = 5
    bisect: bool = True
    partial_responses: bool = True
    parallelization: int = 1  # concurrent batches per shard (ParallelizationFactor)

    def __post_init__(self) -> None:
        if not 1 <= self.parallelization <= 10:
            raise ValueError(f"ParallelizationFactor must be 1 to 10, not {self.parallelization}")
        if self.batch_size < 1:
            raise ValueError(f"BatchSize must be at least 1, not {self.batch_size}")

    @classmethod
    def from_event(
        cls, properties: Mapping[str, Any], parameters: Mapping[str, str]
    ) -> MappingSettings:
        def value(name: str, default: Any) -> Any:
            raw = properties.get(name, default)
            if isinstance(raw, Mapping) and "Ref" in raw:
                return parameters[raw["Ref"]]
            return raw

        return cls(
            batch_size=int(value("BatchSize", 100)),
            window_seconds=float(value("MaximumBatchingWindowInSeconds", 0)),
            max_retries=int(value("MaximumRetryAttempts", -1)),
            bisect=str(value("BisectBatchOnFunctionError", False)).lower() == "true",
            partial_responses="ReportBatchItemFailures"
            in properties.get("FunctionResponseTypes", []),
            parallelization=int(value("ParallelizationFactor", 1)),
        )

    @classmethod
    def from_template(
        cls, template: Mapping[str, Any], function_id: str = "ReconcilerFunction", **overrides: Any
    ) -> MappingSettings:
        """The settings of ``function_id``'s DynamoDB event source, at the parameters' defaults;
        ``overrides`` (e.g. ``parallelization=10``) replace single fields."""
        from tally.local.functions import function, parameter_defaults

        spec = function(template, function_id)
        stream = next(e for e in spec.events.values() if e.get("Type") == "DynamoDB")
        settings = cls.from_event(stream["Properties"], parameter_defaults(template))
        given = {name: value for name, value in overrides.items() if value is not None}
        return replace(settings, **given) if given else settings


class StreamCounts(Protocol):
    """What the trigger counts as it delivers (the pump's report)."""

    records: int
    batches: int
    retries: int
    bisections: int
    sent_to_failure_queue: int
    concurrent_batches: int
    failure_messages: list[dict[str, Any]]


class StreamTrigger:
    """One stream wired to one handler, as a DynamoDB event source mapping wires them."""

    def __init__(
        self,
        reader: StreamReader,
        invoke: Invoke,
        sqs: Any,
        failure_queue_url: str,
        settings: MappingSettings,
        counts: StreamCounts,
        say: Callable[[str], None],
        before_invoke: Callable[[], None],
    ):
        """``before_invoke`` is called before every invocation: it raises to stop."""
        self.reader = reader
        self.invoke = invoke
        self.sqs = sqs
        self.failure_queue_url = failure_queue_url
        self.settings = settings
        self.counts = counts
        self.say = say
        self.before_invoke = before_invoke
        # Per shard, the last record whose fate is settled: what a checkpoint may name.
        self.settled: dict[str, str] = reader.positions()
        # Lanes run in threads: the counts and the settled sequence numbers are shared.
        self._lock = threading.Lock()
        self._done: dict[str, set[str]] = {}  # per shard, records settled this round
        self._running = 0

    def batches(self, records: list[dict[str, Any]]) -> list[list[list[dict[str, Any]]]]:
        """One shard's records as lanes of batches: a record's lane is chosen by its item's
        key, so each item keeps its order within its lane; each lane is cut into batches."""
        factor, size = self.settings.parallelization, self.settings.batch_size
        lanes: list[list[dict[str, Any]]] = [[] for _ in range(factor)]
        for record in records:
            lanes[lane_of(record, factor)].append(record)
        return [
            [lane[start : start + size] for start in range(0, len(lane), size)]
            for lane in lanes
            if lane
        ]

    def deliver_shard(self, shard_id: str, records: list[dict[str, Any]]) -> None:
        """Deliver one shard's records, up to ParallelizationFactor batches at once; the
        checkpoint then moves past the longest run of settled records."""
        lanes = self.batches(records)
        try:
            if len(lanes) == 1:
                self._run_lane(shard_id, lanes[0])
                return
            with ThreadPoolExecutor(len(lanes), thread_name_prefix="pump-lane") as pool:
                futures = [pool.submit(self._run_lane, shard_id, lane) for lane in lanes]
                errors = [f.exception() for f in futures]
            raised = [e for e in errors if e is not None]
            if raised:  # a stop first, then an outage: either leaves the rest to a later poll
                raise next((e for e in raised if not isinstance(e, Outage)), raised[0])
        finally:
            self._advance(shard_id, records)

    def _run_lane(self, shard_id: str, batches: list[list[dict[str, Any]]]) -> None:
        for batch in batches:
            with self._lock:
                self._running += 1
                self.counts.concurrent_batches = max(self.counts.concurrent_batches, self._running)
            try:
                self._deliver(shard_id, batch, attempt=0)
            finally:
                with self._lock:
                    self._running -= 1

    def _deliver(self, shard_id: str, records: list[dict[str, Any]], attempt: int) -> None:
        self.before_invoke()
        with self._lock:
            self.counts.batches += 1
        try:
            response = self.invoke({"Records": records})
        except Exception as error:  # a function error: retry, bisect, or give up
            self.say(f"pump: handler raised {type(error).__name__}: {error}")
            if self.settings.bisect and len(records) > 1:
                with self._lock:
                    self.counts.bisections += 1
                half = len(records) // 2
                self._deliver(shard_id, records[:half], attempt + 1)
                self._deliver(shard_id, records[half:], attempt + 1)
                return
            self._retry_or_fail(shard_id, records, attempt, "Unhandled")
            return
        failed = failed_identifiers(response) if self.settings.partial_responses else []
        numbers = [int(r["dynamodb"]["SequenceNumber"]) for r in records]
        if not failed:
            self._settle(shard_id, records)
            return
        # Lambda retries from the first failed record; an identifier not in the batch fails it all.
        first = min(int(n) for n in failed) if all(n.isdigit() for n in failed) else -1
        done = numbers.index(first) if first in numbers else 0
        self._settle(shard_id, records[:done])
        self._retry_or_fail(shard_id, records[done:], attempt, None)

    def _settle(self, shard_id: str, records: list[dict[str, Any]]) -> None:
        """These records' fate is decided: the checkpoint may move past them."""
        with self._lock:
            self.counts.records += len(records)
            self._done.setdefault(shard_id, set()).update(
                r["dynamodb"]["SequenceNumber"] for r in records
            )

    def _advance(self, shard_id: str, records: list[dict[str, Any]]) -> None:
        """Checkpoint past the longest run of settled records; the reader hands out the
        rest again (a concurrent lane may have settled some of them: at least once)."""
        with self._lock:
            done = self._done.pop(shard_id, set())
        for record in records:
            number = record["dynamodb"]["SequenceNumber"]
            if number not in done:
                self.reader.rewind(shard_id, number)
                return
            self.settled[shard_id] = number

    def _retry_or_fail(
        self, shard_id: str, records: list[dict[str, Any]], attempt: int, error: str | None
    ) -> None:
        limit = self.settings.max_retries
        if limit < 0 or attempt < limit:
            with self._lock:
                self.counts.retries += 1
            time.sleep(min(1.0, 0.05 * 2**attempt))
            self._deliver(shard_id, records, attempt + 1)
            return
        message = failure_message(shard_id, records, self.reader.stream_arn, attempt + 1, error)
        self.sqs.send_message(QueueUrl=self.failure_queue_url, MessageBody=json.dumps(message))
        with self._lock:
            self.counts.sent_to_failure_queue += len(records)
            self.counts.failure_messages.append(message)
            self._done.setdefault(shard_id, set()).update(
                r["dynamodb"]["SequenceNumber"] for r in records
            )
        self.say(
            f"pump: {len(records)} records sent to the on-failure queue after {attempt + 1} tries"
        )


def lane_of(record: Mapping[str, Any], factor: int) -> int:
    """The lane (0 to factor - 1) of a record's item: a stable hash of its whole key."""
    if factor == 1:
        return 0
    keys = json.dumps(record["dynamodb"]["Keys"], sort_keys=True).encode()
    return int.from_bytes(hashlib.blake2b(keys, digest_size=4).digest(), "big") % factor


def failure_message(
    shard_id: str, records: list[dict[str, Any]], stream_arn: str, invokes: int, error: str | None
) -> dict[str, Any]:
    """The record Lambda sends to an on-failure destination for a stream batch."""
    first, last = records[0]["dynamodb"], records[-1]["dynamodb"]
    context: dict[str, Any] = {"statusCode": 200, "executedVersion": "$LATEST"}
    if error:
        context["functionError"] = error
    return {
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "functionArn": "arn:aws:lambda:us-east-1:000000000000:function:tally-local-reconciler",
            "condition": "RetryAttemptsExhausted",
            "approximateInvokeCount": invokes,
        },
        "responseContext": context,
        "version": "1.0",
        "timestamp": iso(datetime.now(UTC)),
        "DDBStreamBatchInfo": {
            "shardId": shard_id,
            "startSequenceNumber": first["SequenceNumber"],
            "endSequenceNumber": last["SequenceNumber"],
            "approximateArrivalOfFirstRecord": _iso(first.get("ApproximateCreationDateTime")),
            "approximateArrivalOfLastRecord": _iso(last.get("ApproximateCreationDateTime")),
            "batchSize": len(records),
            "streamArn": stream_arn,
        },
    }


def _iso(epoch: Any) -> str | None:
    if epoch is None:
        return None
    return epoch_iso(float(epoch))
