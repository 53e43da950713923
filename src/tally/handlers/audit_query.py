"""The export engine's plan: Athena statements for one completed export, from the rules."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from tally.audit.athena_plan import ExportDescription, plan
from tally.core.observability import logger, tracer
from tally.core.settings import settings
from tally.reconciler.runtime import rules


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, str]:
    description = parse(event=event, model=ExportDescription)
    statements = plan(description, rules(), settings().require("athena_database"))
    logger.info(
        "audit query planned",
        extra={"export": statements.export_id, "items": description.ItemCount},
    )
    return asdict(statements)
