"""The ``tally`` command: local stack, stream pump, audit, alerts, replay and rules.

Commands work on the local stack (``tally local up``), on a deployed stack
(``--stack NAME``), or on whatever ``TABLE_NAME``/``AUDIT_TABLE_NAME``/... the environment
already names. The project (template.yaml, src/rules.toml) is the working directory's, or
the one ``--template`` names. The rules file is ``--rules``, else
``RULES_FILE``, else the local stack's, else the one the template bundles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tally import console, targets
from tally.cli_options import EPILOG, named_file, rules_file, rules_option, target_options
from tally.cli_rules import register as register_rules
from tally.console import Failure, UsageError
from tally.local import dynamodb_local
from tally.local import stack as local_stack
from tally.rules import load_rules

MAX_SEGMENTS = 64


def main(argv: list[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    return console.run(lambda: _run(options))


def _run(options: argparse.Namespace) -> int:
    from tally.local.functions import environ

    template: Path | None = getattr(options, "template", None)
    if template is None:
        code: int = options.run(options)
        return code
    template = named_file(template, "--template")
    with environ({"TALLY_TEMPLATE": str(template.absolute())}):
        code = options.run(options)
    return code


# --- the command line --------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tally",
        description="Keep DynamoDB counters honest: local stack, stream pump, audit, alerts, "
        "replay. Commands work on the project in the working directory (template.yaml).",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    project = argparse.ArgumentParser(add_help=False)
    project.add_argument(
        "--template",
        type=Path,
        metavar="PATH",
        help="tally's own template: its functions, tables and rules (default: ./template.yaml)",
    )

    def command(name: str, summary: str, *, parents: bool = True) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            epilog=EPILOG,
            parents=[project] if parents else [],
        )

    local = command("local", "start, stop or describe the local stack", parents=False)
    local_actions = local.add_subparsers(dest="action", required=True, metavar="ACTION")

    def local_action(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = local_actions.add_parser(
            name, help=summary, description=description, epilog=EPILOG
        )
        parser.set_defaults(run=_local)
        return parser

    up = local_action(
        "up",
        "start the local stack, or find it running",
        "Start DynamoDB Local and moto's server (SNS, SQS) on loopback and create the "
        "template's table, audit table, queues and alert topic; a stack already running is "
        "reused. Prints the variables `tally local env` prints.",
    )
    up.add_argument(
        "--template",
        type=Path,
        dest="table_template",
        metavar="PATH",
        help="the counted table from your own template (default: template.yaml's Table; "
        "with --rules alone, a table with the rules' [table] keys)",
    )
    up.add_argument(
        "--table-id",
        metavar="ID",
        help="with --template: its table's logical id (default: its only table)",
    )
    rules_option(up)
    down = local_action(
        "down",
        "stop the local stack",
        "Stop exactly the processes `tally local up` started; its state goes with them.",
    )
    env = local_action(
        "env",
        "the local stack's variables, for eval or sam",
        'The local stack\'s variables as shell exports, for eval "$(tally local env)": '
        "boto3's endpoint variables, dummy credentials, the resource names, RULES_FILE.",
    )
    env.add_argument(
        "--sam",
        action="store_true",
        help="the `sam local invoke --env-vars` file instead (JSON, per function)",
    )
    for other in (down, env):
        # Options of `up` given to another action are usage errors that say where they go.
        other.add_argument("--template", type=Path, dest="table_template", help=argparse.SUPPRESS)
        other.add_argument("--table-id", help=argparse.SUPPRESS)
        other.add_argument("--rules", type=Path, help=argparse.SUPPRESS)

    pump = command("pump", "play Lambda's stream and recheck-queue triggers locally")
    rules_option(pump)
    pump.add_argument("--until-idle", action="store_true", help="stop once all is delivered")
    pump.add_argument(
        "--max-seconds",
        type=_seconds,
        default=300.0,
        metavar="S",
        help="with --until-idle: give up after S seconds (default 300)",
    )
    pump.add_argument(
        "--until-settled",
        action="store_true",
        help="like --until-idle, and wait out every pending recheck (sequence grace, lag)",
    )
    pump.add_argument(
        "--parallelization",
        type=int,
        choices=range(1, 11),
        metavar="N",
        help="concurrent batches per shard, 1 to 10 (default: ParallelizationFactor's default)",
    )
    pump.add_argument(
        "--json", action="store_true", help="when it stops: its report as one JSON object"
    )
    pump.set_defaults(run=_pump)

    audit = command("audit", "full audit of every rule, one rule or one parent")
    audit.add_argument("--rule", metavar="NAME", help="only this rule")
    audit.add_argument(
        "--parent", type=_key_argument, metavar="KEY", help="only this parent: PK=POST#a91f,SK=META"
    )
    mode = audit.add_mutually_exclusive_group()
    mode.add_argument("--repair", action="store_true", help="repair (rules in auto mode)")
    mode.add_argument("--dry-run", action="store_true", help="show repairs, write none (default)")
    audit.add_argument(
        "--alert",
        action="store_true",
        help="publish alerts in a dry run too (--repair always does)",
    )
    audit.add_argument(
        "--segments",
        type=_segments,
        default=4,
        metavar="N",
        help=f"with --engine scan: parallel scan segments, 1 to {MAX_SEGMENTS} (default 4)",
    )
    audit.add_argument(
        "--engine",
        choices=["scan", "duckdb"],
        default="scan",
        help="scan the table (read capacity), or query an export with DuckDB (none)",
    )
    audit.add_argument(
        "--export",
        type=Path,
        metavar="PATH",
        help="with --engine duckdb: the export to audit, or a directory above exports: the "
        "newest of the target's table is audited",
    )
    audit.add_argument(
        "--export-of-another-table",
        action="store_true",
        help="with --export: audit an export of another table than the target's (refused "
        "otherwise; its findings are judged against the target's live table)",
    )
    audit.add_argument("--json", action="store_true", help="the report and findings as JSON")
    target_options(audit)
    audit.set_defaults(run=_audit)

    export = command("export", "write the table in DynamoDB's export layout")
    export.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="directory to write it under"
    )
    export.add_argument(
        "--segments",
        type=_segments,
        default=4,
        metavar="N",
        help=f"parallel scan segments, 1 to {MAX_SEGMENTS} (default 4)",
    )
    export.add_argument(
        "--json", action="store_true", help="the export's directory, id and item count as JSON"
    )
    target_options(export)
    export.set_defaults(run=_export)

    alerts = command("alerts", "alerts the local stack's subscriber received")
    alerts.add_argument("--follow", action="store_true", help="keep printing new ones")
    alerts.add_argument("--json", action="store_true", help="one JSON object per line")
    alerts.set_defaults(run=_alerts)

    replay = command("replay", "re-verify the batches on the stream's on-failure queue")
    target_options(replay)
    replay.set_defaults(run=_replay)

    invoke = command("invoke", "invoke a template function in process on the local stack")
    invoke.add_argument("function", help="its logical id in template.yaml, e.g. ReconcilerFunction")
    invoke.add_argument("event", type=Path, help="an event JSON file, e.g. from events/")
    rules_option(invoke)
    invoke.set_defaults(run=_invoke)

    register_rules(commands)

    from tally.local.examples import EXAMPLES

    examples = command(
        "examples", "fill the local stack with docs/adopting.md's example data", parents=False
    )
    verbs = examples.add_subparsers(dest="action", required=True, metavar="ACTION")
    for verb, summary in (
        ("load", "write an example's data through its own writers, into an empty table"),
        ("fault", "write the fault its walk-through catches, over the loaded data"),
    ):
        action = verbs.add_parser(verb, help=summary, description=summary, epilog=EPILOG)
        action.add_argument(
            "example",
            choices=list(EXAMPLES),
            help="; ".join(f"{e.name}: {e.summary}" for e in EXAMPLES.values()),
        )
    examples.set_defaults(run=_examples)

    demo = command("demo", "the end-to-end demo, on a local stack of its own")
    demo.add_argument("--keep", action="store_true", help="leave the demo's stack running")
    demo.set_defaults(run=_demo)

    ddb = command(
        "dynamodb-local", "fetch DynamoDB Local, or run it in the foreground", parents=False
    )
    ddb.add_argument("action", choices=["fetch", "run"])
    ddb.add_argument(
        "--port", type=dynamodb_local.port_number, default=8000, help="with run (default 8000)"
    )
    ddb.set_defaults(run=_dynamodb_local)
    return parser


def _version() -> str:
    try:
        return version("tally-reconciler")
    except PackageNotFoundError:
        return "(not installed)"


def _segments(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_SEGMENTS:
        raise argparse.ArgumentTypeError(f"a whole number from 1 to {MAX_SEGMENTS}, not {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"a number of seconds above 0, not {text!r}")
    return value


def _key_argument(text: str) -> dict[str, str]:
    try:
        return parse_key(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_key(text: str) -> dict[str, str]:
    """``PK=POST#a91f,SK=META`` as a key; ValueError saying what is malformed."""
    key: dict[str, str] = {}
    for part in text.split(","):
        name, equals, value = part.partition("=")
        if not equals:
            raise ValueError(f"{part!r} is not NAME=VALUE (e.g. PK=POST#a91f,SK=META)")
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"{name!r} is not an attribute name (no spaces: PK=...,SK=...)")
        if not value:
            raise ValueError(f"{name} has no value")
        if value != value.strip():
            raise ValueError(f"the value of {name}, {value!r}, starts or ends with a space")
        if name in key:
            raise ValueError(f"{name} is given twice")
        key[name] = value
    return key


# --- local stack and pump ---------------------------------------------------------------


def _local(options: argparse.Namespace) -> int:
    state_dir = targets.state_dir()
    if options.action != "up" and (options.table_template or options.table_id or options.rules):
        raise UsageError("--template, --table-id and --rules go with `tally local up`")
    if options.table_id and not options.table_template:
        raise UsageError("--table-id names a table of --template FILE")
    if options.action == "up":
        table_id = _table_id(options.table_template, options.table_id)
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
            f"{state_dir / local_stack.SAM_ENV_FILE}"
        )
        print(local_stack.exports(stack))
    elif options.action == "down":
        stopped = local_stack.down(state_dir)
        for line in stopped or ["nothing was running"]:
            console.note(f"stopped: {line}")
    elif options.action == "env" and options.sam:
        print(json.dumps(local_stack.sam_env(targets.running(state_dir)), indent=2))
    else:
        print(local_stack.exports(targets.running(state_dir)))
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


def _pump(options: argparse.Namespace) -> int:
    from tally.local import runner

    state_dir = targets.state_dir()
    rules = rules_file(options)
    if rules is not None:  # a broken rules file stops the pump before it reads a record
        load_rules(rules)
    pump = runner.pump(
        targets.running(state_dir),
        state_dir,
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
        print(json.dumps({"state": state} | dataclasses.asdict(report), default=str))
    if pump.stop_signal:
        return runner.exit_code(pump)
    return 1 if report.sent_to_failure_queue or not report.idle else 0


def _pump_status(report: Any) -> str:
    status = (
        f"{report.records} records, {report.batches} batches, {report.retries} retries, "
        f"{report.sent_to_failure_queue} to the on-failure queue, {report.rechecks} rechecks done"
    )
    return f"{status}; {report.waiting}" if report.waiting else status


# --- operator commands -------------------------------------------------------------------


def _audit(options: argparse.Namespace) -> int:
    from tally.reconciler import runtime
    from tally.reconciler.full_audit import full_audit
    from tally.reconciler.repairs import RepairPolicy

    if (options.engine == "duckdb") != (options.export is not None):
        raise UsageError("--export goes with --engine duckdb, and --engine duckdb with --export")
    if options.export is not None and options.parent is not None:
        raise UsageError("--parent audits one parent by reading the table: not with --export")
    if options.export_of_another_table and options.export is None:
        raise UsageError("--export-of-another-table goes with --engine duckdb --export")
    if options.export is not None:
        _exports_under(options.export)  # a path that holds no export: before any target
    with targets.environment(options.stack, rules_file(options)):
        rules = load_rules()
        rule = _rule(rules, options.rule, options.parent)
        total = targets.item_count()
        export = None
        if options.export is not None:
            export = _read_export(options.export, options.export_of_another_table)
        # The CLI is an operator's deliberate act: a dry run unless --repair, no budget cap.
        policy = RepairPolicy(enabled=True, dry_run=not options.repair, budget=10**9)
        alerting = options.repair or options.alert
        # A dry run's findings are shown to the operator, not recorded or published.
        reconciler = runtime.reconciler(policy, alerting=alerting)
        if export is not None:
            from tally.local.audit_duckdb import DuckDBMissing, duckdb_audit

            try:
                report = duckdb_audit(reconciler, export, rule=rule)
            except DuckDBMissing as error:
                raise Failure(str(error)) from None
        else:
            scanning = options.parent is None and not options.json
            with console.progress("audit: items scanned", total, enabled=scanning) as advance:
                report = full_audit(
                    reconciler,
                    rule=rule,
                    parent=options.parent,
                    segments=options.segments,
                    progress=advance,
                    sleep=console.waiting(
                        "audit: parentless children and sequences are judged a grace period later"
                    ),
                )
        findings = reconciler.log
        if options.parent is not None and not findings:
            _parent_exists(rules, options.parent)
    if options.json:
        print(json.dumps(report.as_json() | {"findings_detail": [f.body() for f in findings]}))
    else:
        console.print_audit(report.as_json(), findings, options.repair, alerting, report.state)
    return 1 if findings or report.state else 0


def _parent_exists(rules: Any, parent: dict[str, str]) -> None:
    """Failure when the table holds no item at ``parent`` (and so the audit found nothing)."""
    from tally.aws import client
    from tally.dynamodb import serialize

    table = targets.table_name()
    key = serialize(rules.table.typed(parent))
    item = client("dynamodb").get_item(TableName=table, Key=key, ConsistentRead=True)
    if "Item" not in item:
        raise Failure(
            f"{console.pattern(parent)}: no such item in table {table}, and no finding under "
            "that key: nothing to audit (check the key; `tally audit` audits every parent)"
        )


def _exports_under(path: Path) -> None:
    from tally.local.exports import ExportError, exports_under

    try:
        exports_under(path)
    except (ExportError, OSError) as error:
        raise UsageError(f"--export {error}") from None


def _read_export(path: Path, any_table: bool) -> Any:
    """The export to audit, named on stderr: the target table's newest under ``path``, or
    (``any_table``) another table's, said so."""
    from tally.local.exports import ExportError, ForeignExportError, TableIdentity, export_of

    target = TableIdentity.described(_target_table())
    try:
        export = export_of(path, target, any_table=any_table)
    except ForeignExportError as error:
        raise UsageError(f"--export {error}; --export-of-another-table audits it anyway") from None
    except (ExportError, OSError) as error:
        raise UsageError(f"--export {error}") from None
    console.note(
        f"audit: export {export.export_id} of table {export.table_arn or '(not named)'}, "
        f"exported {export.export_time or '(time not named)'}, {export.item_count} items, "
        f"in {export.directory}"
    )
    if not target.same(TableIdentity.exported(export.summary)):
        console.note(
            f"audit: that export is of another table than the target's ({target.arn}): "
            "audited as "
            "--export-of-another-table asks, its findings judged against the target's table"
        )
    if export.left_out:
        console.note(f"audit: {export.left_out} exports of other tables under {path} left out")
    return export


def _target_table() -> dict[str, Any]:
    """The target table's description (DescribeTable's ``Table``)."""
    from tally.aws import client
    from tally.settings import settings

    dynamodb = client("dynamodb", config=targets.PREFLIGHT)
    table: dict[str, Any] = dynamodb.describe_table(TableName=settings().table_name)["Table"]
    return table


def _export(options: argparse.Namespace) -> int:
    from tally.local.exports import export_table

    with targets.environment(options.stack, rules_file(options)):
        total = targets.item_count()
        try:
            with console.progress("export: items written", total) as advance:
                export = export_table(options.out, segments=options.segments, progress=advance)
        except OSError as error:
            raise Failure(f"--out {options.out}: {error.strerror or error}") from None
    if options.json:
        print(
            json.dumps(
                {
                    "directory": str(export.directory),
                    "export_id": export.export_id,
                    "items": export.item_count,
                }
            )
        )
        return 0
    # The whole sentence on stderr, the directory alone on stdout: `$(tally export ...)`.
    console.note(f"export: {export.item_count} items written to {export.directory}")
    print(export.directory)
    return 0


def _rule(rules: Any, name: str | None, parent: dict[str, str] | None) -> str | None:
    """The rule to audit; UsageError for a rule or parent key the rules do not know."""
    described = "; ".join(f"{r.name} ({console.pattern(r.parent)})" for r in rules)
    if name is not None:
        if name not in {r.name for r in rules}:
            raise UsageError(f"no rule named {name!r}; the rules: {described}")
        if rules[name].repair == "off":
            raise UsageError(f'rule {name!r} has repair = "off": the audit skips it')
    if parent is None:
        return name
    expected = list(rules.table.names)
    if missing := [n for n in expected if n not in parent]:
        raise UsageError(
            f"--parent lacks {', '.join(missing)}: it needs exactly {', '.join(expected)}, "
            "pairs separated by ',' (PK=POST#a91f,SK=META)"
        )
    if extra := [n for n in parent if n not in expected]:
        raise UsageError(
            f"--parent: {', '.join(extra)} is not a key attribute ({', '.join(expected)})"
        )
    owners = [m.rule.name for m in rules.classify(parent) if m.role == "parent"]
    if name is not None and name not in owners:
        raise UsageError(
            f"{console.pattern(parent)} is not a parent of rule {name!r} "
            f"({console.pattern(rules[name].parent)})"
        )
    if not owners:
        raise UsageError(
            f"{console.pattern(parent)} is the parent of no rule; the rules: {described}"
        )
    return name if name is not None else (owners[0] if len(owners) == 1 else None)


def _alerts(options: argparse.Namespace) -> int:
    from tally.local import inbox

    state_dir = targets.state_dir()
    stack = targets.running(state_dir)
    sqs, url = stack.client("sqs"), local_stack.env(stack)["ALERT_INBOX_URL"]
    printed = 0
    while True:
        alerts = inbox.collect(sqs, url, state_dir)
        new = alerts[printed:]
        if options.json:
            for body in new:
                print(json.dumps(body, sort_keys=True), flush=True)
        elif new or not (printed or options.follow):
            # Followed, each poll's alerts are a table of their own, aligned with the first.
            console.out.print(
                console.table(
                    console.ALERT_COLUMNS,
                    map(console.alert_row, new),
                    widths=console.ALERT_WIDTHS if options.follow else None,
                    header=not printed,
                )
            )
        printed = len(alerts)
        if not options.follow:
            if not alerts and not options.json:
                console.note("alerts: none received yet")
            return 0
        time.sleep(1)


def _replay(options: argparse.Namespace) -> int:
    from tally.reconciler.replay import replay

    with targets.environment(options.stack, rules_file(options)):
        targets.item_count()
        outcome = replay(say=console.note)
    print(json.dumps(outcome))
    return 0 if not outcome["failed"] else 1


def _invoke(options: argparse.Namespace) -> int:
    from tally.local import inbox, invocation, runner
    from tally.local.functions import functions
    from tally.local.pump import RecheckSchedule
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
    sqs, url = stack.client("sqs"), local_stack.env(stack)["ALERT_INBOX_URL"]
    before = len(inbox.collect(sqs, url, state_dir))
    log = state_dir / runner.FUNCTION_LOG
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


def _examples(options: argparse.Namespace) -> int:
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


def _demo(options: argparse.Namespace) -> int:
    from tally.local.demo import run_demo

    # A stack of its own: one the user started is never used or stopped.
    code: int = run_demo(targets.state_dir() / "demo", keep=options.keep)
    return code


def _dynamodb_local(options: argparse.Namespace) -> int:
    arguments = [options.action] + (
        ["--port", str(options.port)] if options.action == "run" else []
    )
    return dynamodb_local.main(arguments)


if __name__ == "__main__":
    sys.exit(main())
