"""Stream handler: verify each batch as a whole, report failed records exactly.

The batch is the unit of work (one recount per parent per batch), so instead of a
per-record handler it returns Lambda's partial batch response itself: the first record of
every group that could not be verified, so Lambda retries from there.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from tally.core.observability import logger, metrics, tracer
from tally.reconciler import runtime
from tally.reconciler.checks.batches import Deadline


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics(capture_cold_start_metric=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    reconciler = runtime.reconciler()
    deadline = Deadline(lambda: context.get_remaining_time_in_millis() / 1000)
    records = event.get("Records") if isinstance(event, dict) else None
    failed = reconciler.verify_batch(records if isinstance(records, list) else [], deadline)
    for finding in reconciler.log:
        logger.warning(
            "finding",
            extra={
                "kind": finding.kind,
                "rule": finding.rule,
                "key": finding.key,
                "repair": finding.repair.status if finding.repair else None,
                "sequence_numbers": [e.sequence_number for e in finding.evidence],
            },
        )
    if failed:
        logger.error(
            "groups left for retry",
            extra={"sequence_numbers": failed, "errors": reconciler.stats.errors},
        )
    runtime.emit_metrics(reconciler)
    return {"batchItemFailures": [{"itemIdentifier": number} for number in failed]}
