"""Scheduled heartbeat of a Global Table's Region: the other Regions measure their link from
here by it (docs/global-tables.md, "Heartbeats")."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from tally.core.observability import logger, metrics, tracer
from tally.reconciler import runtime
from tally.reconciler.table.heartbeats import HeartbeatKeyError, beat_time


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    mode = runtime.global_mode()
    if mode is None:
        return {"skipped": "not a Global Table: no Region to beat to"}
    try:
        beats = runtime.heartbeats()
    except HeartbeatKeyError as error:  # no Region of this table beats: links are not judged
        logger.warning("no heartbeat", extra={"reason": str(error)})
        return {"skipped": str(error)}
    now = beat_time()
    beats.beat(mode.region, now)
    return {"region": mode.region, "beatAt": str(now)}
