"""Running the template's functions against the local stack: invocations and the pump."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tally.local import stack as local_stack
from tally.local.functions import environ, environment, function, parameter_defaults
from tally.local.pump import Invoke, MappingSettings, Pump, Say
from tally.local.stack import LocalStack
from tally.local.template import TEMPLATE_PATH, load_template
from tally.streams import StreamReader, stream_arn

CHECKPOINT_FILE = "stream-checkpoint.json"
FUNCTION_LOG = "functions.log"


@dataclass
class LocalContext:
    """The Lambda context attributes Powertools reads."""

    function_name: str
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:000000000000:function:tally-local"
    aws_request_id: str = "local"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def invoker(
    stack: LocalStack,
    logical_id: str,
    template: Mapping[str, Any] | None = None,
    rules_file: Path | None = None,
) -> Invoke:
    """Call the handler the template names, with the template's environment, locally.

    The functions load the stack's rules file, or ``rules_file`` when given.
    """
    template = template or load_template(TEMPLATE_PATH)
    spec = function(template, logical_id)
    values = environment(template, logical_id, stack.names()) | local_stack.env(stack)
    if rules_file is not None:
        values["RULES_FILE"] = str(rules_file)
    handler = spec.load()
    log = stack.state_dir / FUNCTION_LOG

    def invoke(event: dict[str, Any]) -> Any:
        # The functions' JSON logs and EMF metrics go where CloudWatch would have them.
        with environ(values), log.open("a") as out, _logs_to(out):
            return handler(event, LocalContext(logical_id))

    return invoke


@contextlib.contextmanager
def _logs_to(out: TextIO) -> Iterator[None]:
    from tally.observability import logger

    handler = logger.registered_handler
    stream = handler.setStream(out)  # type: ignore[attr-defined]
    try:
        with contextlib.redirect_stdout(out):
            yield
    finally:
        handler.setStream(stream)  # type: ignore[attr-defined]


def pump(
    stack: LocalStack, state_dir: Path, say: Say | None = None, rules_file: Path | None = None
) -> Pump:
    """A pump wired as template.yaml wires the stream and the recheck queue."""
    template = load_template(TEMPLATE_PATH)
    spec = function(template, "ReconcilerFunction")
    stream = next(e for e in spec.events.values() if e.get("Type") == "DynamoDB")
    settings = MappingSettings.from_event(stream["Properties"], parameter_defaults(template))
    names = stack.names()
    reader = StreamReader(
        stack.client("dynamodbstreams"), stream_arn(stack.client("dynamodb"), names["Table"])
    )
    checkpoint = state_dir / CHECKPOINT_FILE
    if checkpoint.exists():
        reader.resume(json.loads(checkpoint.read_text()))
    return Pump(
        reader,
        invoker(stack, "ReconcilerFunction", template, rules_file),
        invoker(stack, "RecheckFunction", template, rules_file),
        stack.client("sqs"),
        names["RecheckQueue"],
        names["StreamFailureQueue"],
        settings,
        say,
    )


def save_checkpoint(pumped: Pump, state_dir: Path) -> None:
    """Remember where each shard was left, so the next pump starts there."""
    (state_dir / CHECKPOINT_FILE).write_text(json.dumps(pumped.reader.positions()))
