"""Recheck handler: the delay queue's messages, one authoritative check each."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from tally.core.observability import logger, metrics, tracer
from tally.reconciler import runtime
from tally.reconciler.report.rechecks import Recheck, merge_index_looks, mergeable, parse_recheck


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    reconciler = runtime.reconciler()  # one repair budget for the whole batch of rechecks
    readable = _readable(event)
    parsed = dict(readable)
    merged = merge_index_looks(readable, mergeable(reconciler.rules))

    def record_handler(record: SQSRecord) -> None:
        if record.message_id in merged:
            look = merged[record.message_id]
            if look is None:
                return  # a later message of this batch takes the same parent's look
            recheck = look
        else:
            # Parsed once; a body that does not parse fails here, naming its field.
            recheck = parsed.get(record.message_id) or parse_recheck(record.body)
        logger.info(
            "recheck", extra={"rule": recheck.rule, "key": recheck.key, "reason": recheck.reason}
        )
        reconciler.recheck(recheck)

    # A processor per invocation: it keeps the batch's outcomes, and the local pump may run
    # several invocations at once in one process (Lambda runs each in its own).
    processor = BatchProcessor(event_type=EventType.SQS)
    response = process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
    runtime.emit_metrics(reconciler)
    return response


def _readable(event: dict[str, Any]) -> list[tuple[str, Recheck]]:
    """The batch's rechecks that parse (a bad one fails on its own, in its record's turn)."""
    found = []
    for raw in event.get("Records") or []:
        try:
            found.append((str(raw["messageId"]), parse_recheck(raw["body"])))
        except (KeyError, TypeError, ValueError):
            continue
    return found
