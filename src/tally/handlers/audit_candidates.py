"""The export engine's candidates, a batch at a time from the state machine's Distributed Map.

Each row of the Athena query's result goes through the scan audit's path: count and sum
parents are recounted (and repaired) here, sequences go to the recheck queue, items the
index of their rule cannot hold (``unindexed``) are read again and reported.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from tally.audit.candidates import parse_candidate
from tally.audit.full_audit import Audit, audited_rules
from tally.core.observability import logger, metrics, tracer
from tally.reconciler import runtime


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    rows = event.get("Items")
    if not isinstance(rows, list):
        raise ValueError("bad candidate batch: Items: a list of query rows is required")
    reconciler = runtime.reconciler()
    candidates = [parse_candidate(row, reconciler.rules) for row in rows]
    audit = Audit(reconciler, audited_rules(reconciler), "athena")
    audit.check_candidates(candidates, defer=True)
    report = audit.finish()
    logger.info("audit candidates checked", extra={"report": report.as_json()})
    metrics.add_metric(name="AuditCandidates", unit=MetricUnit.Count, value=report.candidates)
    runtime.emit_metrics(reconciler)
    return report.as_json()
