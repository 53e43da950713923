"""Where the ``tally`` commands point: the project's local stack, a deployed stack, or the
environment; each reached with a short preflight before any real work."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from botocore.config import Config

from tally.cli.console import Failure, UsageError
from tally.cli.regions import chosen
from tally.local import stack as local_stack
from tally.local import stack_record

# An unreachable endpoint fails in seconds, not after the standard retry mode's backoff.
PREFLIGHT = Config(
    connect_timeout=2, read_timeout=10, retries={"mode": "standard", "total_max_attempts": 2}
)


def state_dir() -> Path:
    """$TALLY_STATE_DIR, else .tally next to the project's template."""
    configured = os.environ.get("TALLY_STATE_DIR")
    return Path(configured) if configured else stack_record.default_state_dir()


NOT_RUNNING = (
    "the local stack is not running and TABLE_NAME is not set: start it with `tally local up`, "
    "pass --stack NAME, or export the variables `tally local env` prints"
)


def table_name() -> str:
    """The target table's name; Failure saying how to name one when nothing does."""
    name = os.environ.get("TABLE_NAME")
    if not name:
        raise Failure(NOT_RUNNING)
    return name


def running(state_dir: Path, region: str | None = None) -> stack_record.LocalStack:
    """The local stack recorded in ``state_dir``, as ``region`` sees it when one is named;
    Failure saying how to start it if it is not up, UsageError if it has no such Region."""
    stack = stack_record.load(state_dir)
    if stack is None:
        raise Failure("the local stack is not running: start it with `tally local up`")
    regional = chosen(stack, region)
    if not local_stack.answers(stack):
        raise Failure(
            f"the local stack recorded in {state_dir} does not answer (were its processes "
            "stopped?): `tally local up` starts it again"
        )
    return regional


@contextmanager
def environment(stack_name: str | None, rules: Path | None) -> Iterator[None]:
    """The target's variables (deployed stack, local stack, or the current environment)."""
    from tally.local.functions import bundled_rules, environ
    from tally.local.template import load_template, template_path

    if rules is not None and not rules.is_file():
        raise UsageError(f"--rules {rules}: no such file")
    if stack_name:
        values = deployed(stack_name)
    elif (local := stack_record.load(state_dir())) is not None:
        values = stack_record.env(local)
    else:
        values = {}
    if rules is not None:
        values["RULES_FILE"] = str(rules.absolute())
    elif not os.environ.get("RULES_FILE"):
        values.setdefault("RULES_FILE", str(bundled_rules(load_template(template_path()))))
    with environ(values):
        yield


def deployed(stack_name: str) -> dict[str, str]:
    from tally.core.aws import client

    outputs = client("cloudformation", config=PREFLIGHT).describe_stacks(StackName=stack_name)
    found = {o["OutputKey"]: o["OutputValue"] for o in outputs["Stacks"][0].get("Outputs", [])}
    wanted = {
        "TABLE_NAME": "TableName",
        "AUDIT_TABLE_NAME": "AuditTableName",
        "ALERT_TOPIC_ARN": "AlertTopicArn",
        "RECHECK_QUEUE_URL": "RecheckQueueUrl",
        "STREAM_FAILURE_QUEUE_URL": "StreamFailureQueueUrl",
        "REPAIR_SWITCHES_PARAMETER": "RepairSwitchesParameter",
    }
    return {variable: found[output] for variable, output in wanted.items() if output in found}


def item_count() -> int:
    """The target table's item count (an estimate); fails fast when it cannot be reached."""
    from tally.core.aws import client

    name = table_name()  # before any client: no stack is said as such, not as "no region"
    dynamodb = client("dynamodb", config=PREFLIGHT)
    try:
        table = dynamodb.describe_table(TableName=name)["Table"]
    except dynamodb.exceptions.ResourceNotFoundException:
        raise Failure(f"table {name!r} does not exist at {dynamodb.meta.endpoint_url}") from None
    return int(table.get("ItemCount", 0))
