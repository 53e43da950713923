"""The ``tally`` commands of the local stack: ``local up|down|env``, ``pump``, ``alerts``,
``invoke``, ``examples``, ``demo`` and ``dynamodb-local``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import tally.cli.console as console
import tally.cli.regions as regions
import tally.cli.targets as targets
from tally.cli.console import Failure, UsageError
from tally.cli.options import named_file, rules_file
from tally.local import stack as local_stack
from tally.local import stack_record
from tally.local.state import DEMO_DIR, FUNCTION_LOG, SAM_ENV_FILE
from tally.rules import load_rules


def local(options: argparse.Namespace) -> int:
    state_dir = targets.state_dir()
    if options.action != "up" and (options.table_template or options.table_id or options.rules):
        raise UsageError("--template, --table-id and --rules go with `tally local up`")
    if options.table_id and not options.table_template:
        raise UsageError("--table-id names a table of --template FILE")
    multi = (options.regions, options.lag_ms, options.skew_ms, options.consistency)
    if options.action != "up" and multi != (None, None, None, None):
        raise UsageError(
            "--regions, --lag-ms, --skew-ms and --consistency go with `tally local up`"
        )
    if options.action == "up" and not options.regions and multi != (None, None, None, None):
        raise UsageError("--lag-ms, --skew-ms and --consistency go with --regions")
    if options.action == "up":
        table_id = _table_id(options.table_template, options.table_id)
        if options.regions:
            return regions.up(options, state_dir, table_id, rules_file(options))
        stack = local_stack.up(
            state_dir,
            rules_file=rules_file(options),
            template=options.table_template,
            table_id=table_id,
            starting=lambda: console.note(
                "local stack: starting DynamoDB Local and moto's server (SNS, SQS), then "
                "creating the table, the audit table, the queues and the alert topic "
                "(a few seconds)"
            ),
        )
        state = "already running" if stack.already_running else "up"
        console.note(
            f"local stack {state}: DynamoDB Local {stack.dynamodb_endpoint}, "
            f"SNS/SQS {stack.moto_endpoint}; `sam local invoke` variables in "
            f"{state_dir / SAM_ENV_FILE}"
        )
        print(stack_record.exports(stack))
    elif options.action == "down":
        stopped = local_stack.down(state_dir)
        for line in stopped or ["nothing was running"]:
            console.note(f"stopped: {line}")
    else:
        stack = targets.running(state_dir, options.region)
        if options.region is None:
            regions.first_region_note(stack, "local env")
        if options.sam:
            print(json.dumps(stack_record.sam_env(stack), indent=2))
        else:
            print(stack_record.exports(stack))
    return 0


def _table_id(template: Path | None, given: str | None) -> str:
    """The counted table's logical id: ``given``, else ``template``'s only table; UsageError
    naming the template's tables when ``given`` is not one of them or there are several."""
    from tally.local.template import load_template

    if template is None:
        return given or "Table"
    path = named_file(template, "--template")
    resources = load_template(path).get("Resources") or {}
    tables = [
        name
        for name, body in resources.items()
        if isinstance(body, dict) and body.get("Type") == "AWS::DynamoDB::Table"
    ]
    if not tables:
        raise UsageError(f"--template {template}: no AWS::DynamoDB::Table resource")
    if given is None and len(tables) == 1:
        return str(tables[0])
    if given is None:
        raise UsageError(
            f"--template {template} has {len(tables)} tables: name the counted one with "
            f"--table-id ({', '.join(tables)})"
        )
    if given not in tables:
        raise UsageError(
            f"--table-id {given!r}: {template} has no such table; its tables: {', '.join(tables)}"
        )
    return given


def pump(options: argparse.Namespace) -> int:
    from tally.local import runner

    state_dir = targets.state_dir()
    rules = rules_file(options)
    if rules is not None:  # a broken rules file stops the pump before it reads a record
        load_rules(rules)
    stack = targets.running(state_dir, options.region)
    if stack.replication is not None and options.region is None:
        return regions.pump_every_region(stack, options, rules)
    pump = runner.pump(
        stack,
        stack.state_dir,
        say=console.note,
        rules_file=rules,
        parallelization=options.parallelization,
    )
    # The checkpoint is saved after every batch; a signal stops after the invocation in flight.
    with runner.stopped_by_signals(pump), console.live(lambda: _pump_status(pump.report)):
        if options.until_idle or options.until_settled:
            pump.until_idle(options.max_seconds, rechecks=options.until_settled)
        else:
            pump.forever()
    report = pump.report
    if pump.stop_signal:
        state = "stopped"
    else:
        state = "idle" if report.idle else f"not idle after {options.max_seconds:g} s"
    console.note(
        f"pump: {state}. {_pump_status(report)}, {report.pending_rechecks} rechecks not yet due"
    )
    if report.sent_to_failure_queue:
        console.note("pump: batches went to the on-failure queue: `tally replay` re-verifies them")
    if options.json:
        region = {"region": stack.region} if stack.replication is not None else {}
        print(json.dumps(region | {"state": state} | dataclasses.asdict(report), default=str))
    if pump.stop_signal:
        return runner.exit_code(pump)
    return 1 if report.sent_to_failure_queue or not report.idle else 0


def _pump_status(report: Any) -> str:
    status = (
        f"{report.records} records, {report.batches} batches, {report.retries} retries, "
        f"{report.sent_to_failure_queue} to the on-failure queue, {report.rechecks} rechecks done"
    )
    return f"{status}; {report.waiting}" if report.waiting else status


def alerts(options: argparse.Namespace) -> int:
    from tally.local import inbox

    stack = targets.running(targets.state_dir())
    # A multi-Region stack: every Region's subscriber, each alert shown with its Region.
    multi = stack.replication is not None
    columns = ("region", *console.ALERT_COLUMNS) if multi else console.ALERT_COLUMNS
    widths = {"region": 14, **console.ALERT_WIDTHS} if multi else console.ALERT_WIDTHS
    printed = dict.fromkeys(stack.regions, 0)
    while True:
        before = sum(printed.values())
        new = []
        for regional in (stack, *stack.replicas):
            received = inbox.collect(
                regional.client("sqs"), regional.alert_inbox_url, regional.state_dir
            )
            new += [(regional.region, body) for body in received[printed[regional.region] :]]
            printed[regional.region] = len(received)
        if options.json:
            for region, body in new:
                shown = {**body, "region": region} if multi else body
                print(json.dumps(shown, sort_keys=True), flush=True)
        elif new or not (before or options.follow):
            # Followed, each poll's alerts are a table of their own, aligned with the first.
            console.out.print(
                console.table(
                    columns,
                    [[region] * multi + console.alert_row(body) for region, body in new],
                    widths=widths if options.follow else None,
                    header=not before,
                )
            )
        if not options.follow:
            if not sum(printed.values()) and not options.json:
                console.note("alerts: none received yet")
            return 0
        time.sleep(1)


def invoke(options: argparse.Namespace) -> int:
    from tally.local import inbox, invocation, runner
    from tally.local.functions import functions
    from tally.local.recheck_schedule import RecheckSchedule
    from tally.local.template import load_template, template_path

    template = load_template(template_path())
    specs = {spec.logical_id: spec for spec in functions(template)}
    if options.function not in specs:
        raise UsageError(
            f"no function {options.function!r} in {template_path()}; "
            f"its functions: {', '.join(specs)}"
        )
    event = _event(options.event)
    _event_fits(specs[options.function], event, options.event)
    state_dir = targets.state_dir()
    stack = targets.running(state_dir)
    sqs, url = stack.client("sqs"), stack_record.env(stack)["ALERT_INBOX_URL"]
    before = len(inbox.collect(sqs, url, state_dir))
    log = state_dir / FUNCTION_LOG
    console.note(
        f"invoke: {options.function} ({specs[options.function].handler}) in process against "
        f"the local stack; its logs and metrics: {log}"
    )
    schedule = RecheckSchedule()
    start = log.stat().st_size if log.exists() else 0
    try:
        response = runner.invoker(
            stack, options.function, template, rules_file=rules_file(options), schedule=schedule
        )(event)
    except Exception as error:
        raise Failure(f"{options.function} raised {type(error).__name__}: {error}") from error
    print(json.dumps(response, indent=2, default=str))
    with log.open("rb") as lines:
        lines.seek(start)
        added = lines.read().decode(errors="replace").splitlines()
    alerts = [inbox.line(body) for body in inbox.collect(sqs, url, state_dir)[before:]]
    spec = specs[options.function]
    stream = any(source.get("Type") == "DynamoDB" for source in spec.events.values())
    seen = invocation.read(added)
    for line in invocation.summary(seen, schedule.waiting(), alerts, time.time(), stream=stream):
        console.note(f"invoke: {line}")
    return 0


def _event(path: Path) -> dict[str, Any]:
    try:
        event = json.loads(path.read_text())
    except OSError as error:
        raise UsageError(f"event file {path}: {error.strerror}") from None
    except ValueError as error:
        raise UsageError(f"event file {path} is not JSON: {error}") from None
    if not isinstance(event, dict):
        raise UsageError(f"event file {path} holds {type(event).__name__}, not a JSON object")
    return event


# A template event source's type, and what Lambda delivers for it.
_SOURCES = {
    "DynamoDB": "a DynamoDB stream event",
    "SQS": "an SQS event",
    "HttpApi": "an HTTP API event",
    "Api": "an HTTP API event",
}


def _event_kind(event: dict[str, Any]) -> str | None:
    """What delivered ``event``, in the words of ``_SOURCES``; None when it cannot tell."""
    if "routeKey" in event or "httpMethod" in event or "requestContext" in event:
        return "an HTTP API event"
    records = event.get("Records")
    if isinstance(records, list) and records and isinstance(records[0], dict):
        source = records[0].get("eventSource")
        return {"aws:dynamodb": "a DynamoDB stream event", "aws:sqs": "an SQS event"}.get(
            str(source)
        )
    return None


def _event_fits(spec: Any, event: dict[str, Any], path: Path) -> None:
    """UsageError when ``event`` is plainly of a kind no event source of ``spec`` delivers."""
    types = [str(source.get("Type")) for source in spec.events.values()]
    if not types or any(kind not in _SOURCES for kind in types):
        return  # a schedule, a direct invoke: any JSON object is an event
    kind = _event_kind(event)
    wanted = sorted({_SOURCES[kind] for kind in types})
    if kind not in wanted:
        raise UsageError(
            f"event file {path} is {kind or 'no event Lambda delivers to it'}, not "
            f"{' or '.join(wanted)}: {spec.logical_id} is invoked by "
            f"{', '.join(sorted(set(types)))} (events/{spec.logical_id}/ holds examples)"
        )


def examples(options: argparse.Namespace) -> int:
    from tally.local.examples import EXAMPLES
    from tally.local.template import template_path

    example = EXAMPLES[options.example]
    stack = targets.running(targets.state_dir())
    directory = example.directory(template_path().parent)
    template = directory / "template.yaml"
    if stack.table_source != f"{template.resolve()}#{example.table_id}":
        raise Failure(
            f"the local stack runs table {stack.table_source or '(the rules file)'}, not the "
            f"{example.name} example's: `tally local down`, then `tally local up --rules "
            f"{directory / 'rules.toml'} --template {template}`"
        )
    dynamodb = stack.client("dynamodb")
    if options.action == "load":
        if dynamodb.scan(TableName=stack.table_name, Limit=1)["Items"]:
            raise Failure(
                f"table {stack.table_name} holds items already: the example loads into an "
                "empty table (`tally local down` and `up` start a new one)"
            )
        written = example.load(dynamodb, stack.table_name)
        console.note(f"examples: {example.summary}: {written} items written to {stack.table_name}")
    else:
        console.note(f"examples: {example.fault(dynamodb, stack.table_name)}")
    return 0


def demo(options: argparse.Namespace) -> int:
    from tally.local.demo import run_demo

    # A stack of its own: one the user started is never used or stopped.
    code: int = run_demo(targets.state_dir() / DEMO_DIR, keep=options.keep)
    return code


def dynamodb_local(options: argparse.Namespace) -> int:
    from tally.local.dynamodb_local import main as emulator

    arguments = [options.action] + (
        ["--port", str(options.port)] if options.action == "run" else []
    )
    return emulator(arguments)
