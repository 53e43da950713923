"""Lambda's SQS trigger, played locally: due messages to the handler, handled ones deleted.

As with Lambda, a message the handler reports as failed (or every message of a batch whose
handler raised) is not deleted: SQS offers it again once its visibility timeout ends, and
the queue's redrive policy moves it to the dead-letter queue after enough receives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

# What AWS calls raise when a service is down, throttled or unreachable.
Outage = (BotoCoreError, ClientError)

Invoke = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class Delivery:
    """One batch's outcome."""

    handled: int
    failed: int
    error: Exception | None = None  # what the handler raised, if it did


@dataclass(frozen=True)
class QueueDepth:
    """A queue's approximate counts."""

    visible: int  # due, not yet received
    delayed: int  # still in their delay
    in_flight: int  # received, neither deleted nor visible again

    @property
    def total(self) -> int:
        return self.visible + self.delayed + self.in_flight


class QueueTrigger:
    """One queue wired to one handler, as an SQS event source mapping wires them."""

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        invoke: Invoke,
        batch_size: int = 10,
        visibility_seconds: int = 30,
        region: str = "us-east-1",
    ) -> None:
        self.sqs = sqs
        self.region = region
        self.queue_url = queue_url
        self.invoke = invoke
        self.batch_size = batch_size
        # Locally shorter than the queue's own timeout, so a failed message returns soon.
        self.visibility_seconds = visibility_seconds
        # Pollers on several threads take turns at the queue (moto's server fails a receive
        # that overlaps another: "Set changed size during iteration"); their invocations
        # overlap, as Lambda's do.
        self._polling = threading.Lock()

    def deliver_batch(self) -> Delivery | None:
        """Receive and deliver one batch; None when no message is due.

        SQS errors propagate (the caller waits the outage out); handler errors do not.
        """
        with self._polling:
            messages = self.sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=self.batch_size,
                WaitTimeSeconds=0,
                VisibilityTimeout=self.visibility_seconds,
                AttributeNames=["All"],
            ).get("Messages", [])
        if not messages:
            return None
        event = {"Records": [sqs_event_record(m, self.queue_url, self.region) for m in messages]}
        try:
            response = self.invoke(event)
        except Exception as error:  # e.g. Powertools' BatchProcessingError: every record failed
            return Delivery(0, len(messages), error)
        failed = set(failed_identifiers(response))
        done = [m for m in messages if m["MessageId"] not in failed]
        if done:
            # One left undeleted by an outage here is delivered again: at least once, as SQS.
            with self._polling:
                self._delete(done)
        return Delivery(len(done), len(messages) - len(done))

    def _delete(self, done: list[dict[str, Any]]) -> None:
        self.sqs.delete_message_batch(
            QueueUrl=self.queue_url,
            Entries=[
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(done)
            ],
        )

    def depth(self) -> QueueDepth:
        """Messages due, delayed and in flight (SQS's approximate counts)."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesDelayed",
                "ApproximateNumberOfMessagesNotVisible",
            ],
        )["Attributes"]
        return QueueDepth(
            visible=int(attributes["ApproximateNumberOfMessages"]),
            delayed=int(attributes["ApproximateNumberOfMessagesDelayed"]),
            in_flight=int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        )


def failed_identifiers(response: Any) -> list[str]:
    """The item identifiers of a partial batch response (none if it is not one)."""
    if not isinstance(response, Mapping):
        return []
    return [str(f["itemIdentifier"]) for f in response.get("batchItemFailures") or []]


def sqs_event_record(
    message: Mapping[str, Any], queue_url: str, region: str = "us-east-1"
) -> dict[str, Any]:
    """An SQS message in Lambda's SQS event record shape."""
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": message.get("Attributes", {}),
        "messageAttributes": message.get("MessageAttributes", {}),
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:{region}:000000000000:{queue_url.rsplit('/', 1)[-1]}",
        "awsRegion": region,
    }
