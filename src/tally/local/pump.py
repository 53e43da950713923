"""The stream pump: Lambda's DynamoDB event source mapping, played against DynamoDB Local.

It reads every shard about four times a second, fills batches up to the mapping's batch
size or batching window, invokes the handler the template names, and honours the
mapping's settings: partial batch responses (retry from the first failed record),
bisection on a function error, a retry limit, and the on-failure queue after it. It also
feeds the recheck queue's due messages to the recheck handler, as SQS would.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tally.streams import StreamReader

Invoke = Callable[[dict[str, Any]], Any]
Say = Callable[[str], None]
POLLS_PER_SECOND = 4


@dataclass(frozen=True)
class MappingSettings:
    """The event source mapping's behaviour, as template.yaml declares it."""

    batch_size: int = 100
    window_seconds: float = 0.0
    max_retries: int = 5
    bisect: bool = True
    partial_responses: bool = True

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
            bisect=bool(value("BisectBatchOnFunctionError", False)),
            partial_responses="ReportBatchItemFailures"
            in properties.get("FunctionResponseTypes", []),
        )


@dataclass
class PumpReport:
    """What the pump delivered."""

    records: int = 0
    batches: int = 0
    retries: int = 0
    bisections: int = 0
    sent_to_failure_queue: int = 0
    rechecks: int = 0
    pending_rechecks: int = 0
    failure_messages: list[dict[str, Any]] = field(default_factory=list)


class Pump:
    """Delivers the stream to the reconciler and the recheck queue to the recheck handler."""

    def __init__(
        self,
        reader: StreamReader,
        invoke_stream: Invoke,
        invoke_recheck: Invoke,
        sqs: Any,
        recheck_queue_url: str,
        failure_queue_url: str,
        settings: MappingSettings,
        say: Say | None = None,
    ):
        self.reader = reader
        self.invoke_stream = invoke_stream
        self.invoke_recheck = invoke_recheck
        self.sqs = sqs
        self.recheck_queue_url = recheck_queue_url
        self.failure_queue_url = failure_queue_url
        self.settings = settings
        self.say = say or (lambda _: None)
        self.report = PumpReport()

    def until_idle(self, max_seconds: float = 300.0) -> PumpReport:
        """Pump until the stream and the due rechecks are drained; count rechecks not yet due."""
        deadline = time.monotonic() + max_seconds
        idle = 0
        while idle < 2 and time.monotonic() < deadline:
            moved = self.step()
            idle = 0 if moved else idle + 1
            if not moved:
                time.sleep(1 / POLLS_PER_SECOND)
        self.report.pending_rechecks = self.pending_rechecks()
        return self.report

    def forever(self) -> None:
        """Pump until interrupted, polling about four times a second."""
        while True:
            if not self.step():
                time.sleep(1 / POLLS_PER_SECOND)

    def step(self) -> int:
        """One round: deliver what the shards hold, then the due rechecks."""
        moved = 0
        for shard_id, records in self._batches():
            self._deliver(shard_id, records, attempt=0)
            moved += len(records)
        moved += self._rechecks()
        return moved

    # --- the stream ---------------------------------------------------------------------

    def _batches(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """Batches per shard, filled up to the batch size or until the window closes."""
        size = self.settings.batch_size
        gathered: dict[str, list[dict[str, Any]]] = {}
        window_ends = time.monotonic() + self.settings.window_seconds
        while True:
            for shard_id, records in self.reader.poll_batches(limit=size):
                gathered.setdefault(shard_id, []).extend(records)
            full = any(len(r) >= size for r in gathered.values())
            if not gathered or full or time.monotonic() >= window_ends:
                break
            time.sleep(min(1 / POLLS_PER_SECOND, max(0.0, window_ends - time.monotonic())))
        return [
            (shard_id, records[start : start + size])
            for shard_id, records in gathered.items()
            for start in range(0, len(records), size)
        ]

    def _deliver(self, shard_id: str, records: list[dict[str, Any]], attempt: int) -> None:
        self.report.batches += 1
        try:
            response = self.invoke_stream({"Records": records})
        except Exception as error:  # a function error: retry, bisect, or give up
            self.say(f"pump: handler raised {type(error).__name__}: {error}")
            if self.settings.bisect and len(records) > 1:
                self.report.bisections += 1
                half = len(records) // 2
                self._deliver(shard_id, records[:half], attempt + 1)
                self._deliver(shard_id, records[half:], attempt + 1)
                return
            self._retry_or_fail(shard_id, records, attempt, "Unhandled")
            return
        self.report.records += len(records)
        failed = _failed_sequence_numbers(response) if self.settings.partial_responses else []
        if failed:
            first = min(failed, key=int)
            remaining = [r for r in records if int(r["dynamodb"]["SequenceNumber"]) >= int(first)]
            self.report.records -= len(remaining)
            self._retry_or_fail(shard_id, remaining, attempt, None)

    def _retry_or_fail(
        self, shard_id: str, records: list[dict[str, Any]], attempt: int, error: str | None
    ) -> None:
        limit = self.settings.max_retries
        if limit < 0 or attempt < limit:
            self.report.retries += 1
            time.sleep(min(1.0, 0.05 * 2**attempt))
            self._deliver(shard_id, records, attempt + 1)
            return
        message = _failure_message(shard_id, records, self.reader.stream_arn, attempt + 1, error)
        self.sqs.send_message(QueueUrl=self.failure_queue_url, MessageBody=json.dumps(message))
        self.report.sent_to_failure_queue += len(records)
        self.report.failure_messages.append(message)
        self.say(
            f"pump: {len(records)} records sent to the on-failure queue after {attempt + 1} tries"
        )

    # --- the recheck queue -------------------------------------------------------------

    def _rechecks(self) -> int:
        delivered = 0
        while True:
            messages = self.sqs.receive_message(
                QueueUrl=self.recheck_queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                VisibilityTimeout=30,  # a failed recheck comes back after this
                AttributeNames=["All"],
            ).get("Messages", [])
            if not messages:
                return delivered
            event = {"Records": [sqs_event_record(m, self.recheck_queue_url) for m in messages]}
            response = self.invoke_recheck(event)
            failed = set(_failed_sequence_numbers(response))
            for message in messages:
                if message["MessageId"] not in failed:
                    self.sqs.delete_message(
                        QueueUrl=self.recheck_queue_url, ReceiptHandle=message["ReceiptHandle"]
                    )
            delivered += len(messages) - len(failed)
            self.report.rechecks += len(messages) - len(failed)
            if failed:
                return delivered

    def pending_rechecks(self) -> int:
        """Rechecks not yet due (still in their grace delay) or in flight."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.recheck_queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessagesDelayed",
                "ApproximateNumberOfMessagesNotVisible",
            ],
        )["Attributes"]
        return sum(int(v) for v in attributes.values())


def _failed_sequence_numbers(response: Any) -> list[str]:
    if not isinstance(response, Mapping):
        return []
    return [str(f["itemIdentifier"]) for f in response.get("batchItemFailures") or []]


def _failure_message(
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
        "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
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
    return datetime.fromtimestamp(float(epoch), UTC).isoformat().replace("+00:00", "Z")


def sqs_event_record(message: Mapping[str, Any], queue_url: str) -> dict[str, Any]:
    """An SQS message in Lambda's SQS event record shape."""
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": message.get("Attributes", {}),
        "messageAttributes": message.get("MessageAttributes", {}),
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:us-east-1:000000000000:{queue_url.rsplit('/', 1)[-1]}",
        "awsRegion": "us-east-1",
    }
