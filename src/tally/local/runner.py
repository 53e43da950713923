"""Running the template's functions against the local stack: invocations and the pump."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from aws_lambda_powertools import Logger

from tally.core.streams import StreamReader, stream_arn
from tally.local import stack_record
from tally.local.checkpoint import Checkpoint
from tally.local.functions import cold_start, environment, function, variables
from tally.local.pump import CARRY_SECONDS, Pump, Say
from tally.local.recheck_schedule import RecheckSchedule
from tally.local.sqs_trigger import Invoke
from tally.local.stack_record import LocalStack
from tally.local.state import CHECKPOINT_FILE, FUNCTION_LOG
from tally.local.stream_trigger import MappingSettings
from tally.local.template import load_template, template_path
from tally.rules import load_rules

# Local mode has no X-Ray daemon (`sam local invoke` disables tracing the same way).
LOCAL_ENVIRONMENT = {"POWERTOOLS_TRACE_DISABLED": "true"}


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
    schedule: RecheckSchedule | None = None,
    parallelization: int | None = None,
) -> Invoke:
    """Call the handler the template names, with the template's environment, locally.

    The functions load the stack's rules file, or ``rules_file`` when given; ``schedule``
    notes the rechecks the function sends; ``parallelization`` is the factor the pump
    emulates, which the functions read as the template would set it.
    """
    template = template or load_template(template_path())
    spec = function(template, logical_id)
    values = (
        environment(template, logical_id, stack.names(), stack.region)
        | stack_record.env(stack)
        | LOCAL_ENVIRONMENT
        | {"AWS_REGION": stack.region}  # as Lambda sets it
    )
    if rules_file is not None:
        values["RULES_FILE"] = str(rules_file)
    if parallelization is not None:
        values["PARALLELIZATION_FACTOR"] = str(parallelization)
    started = cold_start(spec, values)
    logger: Logger = started.modules["tally.core.observability"].logger
    runtime = started.modules.get("tally.reconciler.runtime")
    if schedule is not None and runtime is not None:  # a function that sends rechecks
        with variables(values):
            schedule.watch(runtime._clients()[2])
    log = stack.state_dir / FUNCTION_LOG
    arn = f"arn:aws:lambda:{stack.region}:000000000000:function:tally-local"

    def invoke(event: dict[str, Any]) -> Any:
        # The functions' JSON logs and EMF metrics go where CloudWatch would have them.
        with variables(values), log.open("a") as out, _logs_to(logger, out):
            return started.handler(event, LocalContext(logical_id, invoked_function_arn=arn))

    return invoke


@contextlib.contextmanager
def _logs_to(logger: Logger, out: TextIO) -> Iterator[None]:
    handler = logger.registered_handler
    stream = handler.setStream(out)  # type: ignore[attr-defined]
    try:
        with contextlib.redirect_stdout(out):
            yield
    finally:
        handler.setStream(stream)  # type: ignore[attr-defined]


def pump(
    stack: LocalStack,
    state_dir: Path,
    say: Say | None = None,
    rules_file: Path | None = None,
    parallelization: int | None = None,
) -> Pump:
    """A pump wired as template.yaml wires the stream and the recheck queue.

    It resumes after the checkpoint in ``state_dir`` and saves it after every batch.
    ``parallelization`` replaces the template's ParallelizationFactor.
    """
    template = load_template(template_path())
    # The rules the functions will load, validated before the first record is read: a broken
    # rules file is the pump's own fault, never a batch's to send to the on-failure queue.
    load_rules(rules_file or stack_record.env(stack)["RULES_FILE"])
    settings = MappingSettings.from_template(template, parallelization=parallelization)
    schedule = RecheckSchedule()
    carry = environment(template, "ReconcilerFunction", stack.names(), stack.region).get(
        "CARRY_SECONDS"
    )
    names = stack.names()
    reader = StreamReader(
        stack.client("dynamodbstreams"),
        stream_arn(stack.client("dynamodb"), names["Table"]),
        stack.region,
    )
    checkpoint = Checkpoint(state_dir / CHECKPOINT_FILE, reader.stream_arn, say)
    reader.resume(checkpoint.load())
    return Pump(
        reader,
        invoker(
            stack, "ReconcilerFunction", template, rules_file, schedule, settings.parallelization
        ),
        invoker(stack, "RecheckFunction", template, rules_file, schedule, settings.parallelization),
        stack.client("sqs"),
        names["RecheckQueue"],
        names["StreamFailureQueue"],
        settings,
        say,
        checkpoint,
        carry_seconds=float(carry) if carry else CARRY_SECONDS,
        schedule=schedule,
        region=stack.region,
    )


@contextlib.contextmanager
def stopped_by_signals(pumped: Pump) -> Iterator[None]:
    """SIGINT and SIGTERM stop the pump after the invocation in flight; a second one abandons it.

    Only settled records are checkpointed either way, so nothing is skipped on restart.
    """
    previous = {
        number: signal.signal(number, lambda received, _: pumped.stop(received))
        for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    except KeyboardInterrupt:
        if pumped.stop_signal is None:  # not ours: an interrupt raised by something else
            raise
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def exit_code(pumped: Pump) -> int:
    """0, or 128 + the signal that stopped the pump (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + pumped.stop_signal if pumped.stop_signal else 0
