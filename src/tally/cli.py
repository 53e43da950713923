"""The ``tally`` command: local stack, stream pump, audit, alerts, replay and rules.

Commands work on the local stack (``tally local up``), on a deployed stack
(``--stack NAME``), or on whatever ``TABLE_NAME``/``AUDIT_TABLE_NAME``/... the environment
already names. The rules file is ``--rules``, else ``RULES_FILE``, else the local stack's,
else the bundled example.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tally.local import dynamodb_local
from tally.local import stack as local_stack
from tally.local.template import TEMPLATE_PATH
from tally.rules import DEFAULT_RULES_FILE, RulesFileError

STATE_DIR = Path(os.environ.get("TALLY_STATE_DIR") or local_stack.DEFAULT_STATE_DIR)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    try:
        code: int = options.run(options)
    except (dynamodb_local.DynamoDBLocalUnavailable, local_stack.LocalStackError) as error:
        print(f"tally: {error}", file=sys.stderr)
        return 1
    except RulesFileError as error:
        print(f"tally: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tally", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="start, stop or describe the local stack")
    local.add_argument("action", choices=["up", "down", "env"])
    local.add_argument(
        "--sam", action="store_true", help="with env: a `sam local invoke --env-vars` file"
    )
    local.add_argument("--template", type=Path, help="with up: the table from your template")
    local.add_argument("--table-id", help="with --template: its table's logical id (Table)")
    rules_option(local)
    local.set_defaults(run=_local)

    pump = commands.add_parser("pump", help="play Lambda's stream and queue triggers locally")
    rules_option(pump)
    pump.add_argument("--until-idle", action="store_true", help="stop once drained")
    pump.add_argument("--max-seconds", type=float, default=300.0)
    pump.set_defaults(run=_pump)

    audit = commands.add_parser("audit", help="full audit: every rule, one rule or one parent")
    audit.add_argument("--rule", help="only this rule")
    audit.add_argument("--parent", help="only this parent, e.g. PK=POST#a91f,SK=META")
    mode = audit.add_mutually_exclusive_group()
    mode.add_argument("--repair", action="store_true", help="repair (rules in auto mode)")
    mode.add_argument("--dry-run", action="store_true", help="show repairs, write none (default)")
    audit.add_argument("--segments", type=int, default=4, help="parallel scan segments")
    audit.add_argument(
        "--engine",
        choices=["scan", "duckdb"],
        default="scan",
        help="scan the table (read capacity), or query an export with DuckDB (none)",
    )
    audit.add_argument("--export", type=Path, help="with --engine duckdb: the export to audit")
    audit.add_argument("--json", action="store_true", help="the report as JSON")
    _target(audit)
    rules_option(audit)
    audit.set_defaults(run=_audit)

    export = commands.add_parser("export", help="write the table in DynamoDB's export layout")
    export.add_argument("--out", type=Path, required=True, help="directory to write it under")
    export.add_argument("--segments", type=int, default=4, help="parallel scan segments")
    _target(export)
    export.set_defaults(run=_export)

    alerts = commands.add_parser("alerts", help="alerts the local subscriber received")
    alerts.add_argument("--follow", action="store_true", help="keep printing new ones")
    alerts.add_argument("--json", action="store_true", help="one JSON object per line")
    alerts.set_defaults(run=_alerts)

    replay = commands.add_parser("replay", help="re-verify what landed on the on-failure queue")
    _target(replay)
    rules_option(replay)
    replay.set_defaults(run=_replay)

    invoke = commands.add_parser("invoke", help="invoke a template function in process")
    invoke.add_argument("function", help="logical id, e.g. ReconcilerFunction")
    invoke.add_argument("event", type=Path, help="event JSON file, e.g. from events/")
    rules_option(invoke)
    invoke.set_defaults(run=_invoke)

    from tally.cli_rules import register

    register(commands)

    demo = commands.add_parser("demo", help="the end-to-end demo on the local stack")
    demo.add_argument("--keep", action="store_true", help="leave the local stack running")
    demo.set_defaults(run=_demo)

    ddb = commands.add_parser("dynamodb-local", help="fetch or run DynamoDB Local")
    ddb.add_argument("args", nargs=argparse.REMAINDER, help="fetch | run [--port N]")
    ddb.set_defaults(run=lambda o: dynamodb_local.main(o.args))
    return parser


def _target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", help="a deployed stack's name (default: the local stack)")


def rules_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules", type=Path, help="the rules file (default: $RULES_FILE, else the stack's)"
    )


def rules_file(options: argparse.Namespace) -> Path | None:
    """The rules file the user named (``--rules``, else ``RULES_FILE``), or None."""
    given = getattr(options, "rules", None) or os.environ.get("RULES_FILE")
    return Path(given).resolve() if given else None


# --- local stack and pump ---------------------------------------------------------------


def _local(options: argparse.Namespace) -> int:
    if options.action != "up" and (options.template or options.table_id):
        print("tally: --template and --table-id go with `tally local up`", file=sys.stderr)
        return 2
    if options.table_id and not options.template:
        print("tally: --table-id names a table of --template FILE", file=sys.stderr)
        return 2
    if options.action == "up":
        stack = local_stack.up(
            STATE_DIR,
            rules_file=rules_file(options),
            template=options.template,
            table_id=options.table_id or "Table",
        )
        state = "already running" if stack.already_running else "up"
        print(
            f"local stack {state}: DynamoDB Local {stack.dynamodb_endpoint}, "
            f"SNS/SQS {stack.moto_endpoint}",
            file=sys.stderr,
        )
        print(local_stack.exports(stack))
    elif options.action == "down":
        stopped = local_stack.down(STATE_DIR)
        for line in stopped or ["nothing was running"]:
            print(f"stopped: {line}", file=sys.stderr)
    elif options.sam:
        print(json.dumps(_sam_env_vars(_running()), indent=2))
    else:
        print(local_stack.exports(_running()))
    return 0


def _sam_env_vars(stack: local_stack.LocalStack) -> dict[str, dict[str, str]]:
    """Per function, the variables that point a container (host network) at the stack."""
    from tally.local.functions import functions
    from tally.local.template import load_template

    values = local_stack.env(stack) | {
        "DYNAMODB_ENDPOINT": stack.dynamodb_endpoint,
        "SNS_ENDPOINT": stack.moto_endpoint,
        "SQS_ENDPOINT": stack.moto_endpoint,
    }
    return {
        spec.logical_id: {k: values[k] for k in spec.environment if k in values}
        for spec in functions(load_template(TEMPLATE_PATH))
    }


def _running() -> local_stack.LocalStack:
    stack = local_stack.load(STATE_DIR)
    if stack is None:
        raise SystemExit("tally: the local stack is not running: start it with `tally local up`")
    return stack


def _pump(options: argparse.Namespace) -> int:
    from tally.local import runner

    pump = runner.pump(
        _running(),
        STATE_DIR,
        say=lambda line: print(line, file=sys.stderr),
        rules_file=rules_file(options),
    )
    with runner.stopped_by_signals(pump):
        if options.until_idle:
            report = pump.until_idle(options.max_seconds)
            state = "idle" if report.idle else "stopped before idle"
            print(
                f"pump: {state}. {report.records} records, {report.batches} batches, "
                f"{report.retries} retries, {report.sent_to_failure_queue} to the on-failure "
                f"queue, {report.rechecks} rechecks done, {report.pending_rechecks} not yet due",
                file=sys.stderr,
            )
            if not report.idle and not pump.stop_signal:
                return 1
        else:
            pump.forever()
    return runner.exit_code(pump)


# --- operator commands -------------------------------------------------------------------


@contextmanager
def environment(stack_name: str | None, rules: Path | None) -> Iterator[None]:
    """The target's variables (deployed stack, local stack, or the current environment),
    and the rules file: ``rules`` if given, else the local stack's, else the bundled one."""
    from tally.local.functions import environ

    if stack_name:
        values = _deployed(stack_name)
    elif (local := local_stack.load(STATE_DIR)) is not None:
        values = local_stack.env(local)
    else:
        values = {}
    if rules is not None:
        values["RULES_FILE"] = str(rules)
    values.setdefault("RULES_FILE", str(DEFAULT_RULES_FILE))
    with environ(values):
        yield


def _deployed(stack_name: str) -> dict[str, str]:
    from tally.aws import client

    outputs = client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"][0]
    found = {o["OutputKey"]: o["OutputValue"] for o in outputs.get("Outputs", [])}
    wanted = {
        "TABLE_NAME": "TableName",
        "AUDIT_TABLE_NAME": "AuditTableName",
        "ALERT_TOPIC_ARN": "AlertTopicArn",
        "RECHECK_QUEUE_URL": "RecheckQueueUrl",
        "STREAM_FAILURE_QUEUE_URL": "StreamFailureQueueUrl",
    }
    return {variable: found[output] for variable, output in wanted.items() if output in found}


def _audit(options: argparse.Namespace) -> int:
    from tally.reconciler import runtime
    from tally.reconciler.full_audit import full_audit
    from tally.reconciler.repairs import RepairPolicy

    if (options.engine == "duckdb") != (options.export is not None) or (
        options.parent and options.export
    ):
        print("tally: --export goes with --engine duckdb (and not with --parent)", file=sys.stderr)
        return 2
    export = None
    if options.export is not None:
        from tally.local.exports import ExportError, read_export

        try:
            export = read_export(options.export)
        except ExportError as error:
            print(f"tally: {error}", file=sys.stderr)
            return 2
        print(f"auditing export {export.export_id} ({export.item_count} items)", file=sys.stderr)
    with environment(options.stack, rules_file(options)):
        checker = runtime.reconciler()
        # The CLI is an operator's deliberate act: a dry run unless --repair, no budget cap.
        checker.policy = RepairPolicy(enabled=True, dry_run=not options.repair, budget=10**9)
        if export is not None:
            from tally.local.audit_duckdb import DuckDBMissing, duckdb_audit

            try:
                report = duckdb_audit(checker, export, rule=options.rule)
            except DuckDBMissing as error:
                print(f"tally: {error}", file=sys.stderr)
                return 1
        else:
            bar = _ProgressBar()
            report = full_audit(
                checker,
                rule=options.rule,
                parent=_key(options.parent) if options.parent else None,
                segments=options.segments,
                progress=bar.advance,
            )
            bar.done()
    if options.json:
        print(json.dumps(report.as_json() | {"findings_detail": [f.body() for f in checker.log]}))
        return 0
    print(_audit_table(report.as_json(), checker.log))
    return 0


def _export(options: argparse.Namespace) -> int:
    from tally.local.exports import export_table

    with environment(options.stack, None):
        export = export_table(options.out, segments=options.segments)
    print(f"exported {export.item_count} items to", file=sys.stderr)
    print(export.directory)
    return 0


def _key(text: str) -> dict[str, str]:
    try:
        return dict(part.split("=", 1) for part in text.split(","))
    except ValueError:
        raise SystemExit(
            f"tally: --parent must look like PK=POST#a91f,SK=META, got {text!r}"
        ) from None


class _ProgressBar:
    """Items scanned, on stderr, redrawn in place."""

    def __init__(self) -> None:
        self.items = 0
        self.started = time.monotonic()

    def advance(self, items: int) -> None:
        self.items += items
        rate = self.items / max(time.monotonic() - self.started, 1e-6)
        filled = min(30, self.items // 100)
        sys.stderr.write(f"\raudit [{'#' * filled:<30}] {self.items} items ({rate:,.0f}/s)")
        sys.stderr.flush()

    def done(self) -> None:
        sys.stderr.write("\n")


def _audit_table(report: dict[str, Any], findings: list[Any]) -> str:
    per_rule: dict[str, dict[str, int]] = {}
    for finding in findings:
        row = per_rule.setdefault(finding.rule, {})
        row[finding.kind] = row.get(finding.kind, 0) + 1
        if finding.repair and finding.repair.status == "applied":
            row["repaired"] = row.get("repaired", 0) + 1
    lines = [
        f"{'rule':<16} {'checked':>8} {'drift':>6} {'gaps':>5} {'other':>6} {'repaired':>9}",
        "-" * 56,
    ]
    for rule in report["rules"]:
        row = per_rule.get(rule, {})
        other = sum(v for k, v in row.items() if k not in ("drift", "gap", "repaired"))
        lines.append(
            f"{rule:<16} {report['parents_checked'].get(rule, 0):>8} {row.get('drift', 0):>6} "
            f"{row.get('gap', 0):>5} {other:>6} {row.get('repaired', 0):>9}"
        )
    total = sum(report["findings"].values())
    lines.append("-" * 56)
    export = report["export"]
    scanned = f"{report['items_scanned']} items scanned"
    read = f"{export['items']} items exported" if export else scanned
    lines.append(
        f"{read}, {report['recounted']} parents recounted, "
        f"{total} findings, {report['seconds']} s" + ("" if total else ": clean")
    )
    return "\n".join(lines)


def _alerts(options: argparse.Namespace) -> int:
    from tally.local import inbox

    stack = _running()
    sqs, url = stack.client("sqs"), local_stack.env(stack)["ALERT_INBOX_URL"]
    printed = 0
    while True:
        alerts = inbox.collect(sqs, url, STATE_DIR)
        for body in alerts[printed:]:
            print(
                json.dumps(body, sort_keys=True) if options.json else inbox.line(body), flush=True
            )
        printed = len(alerts)
        if not options.follow:
            return 0
        time.sleep(1)


def _replay(options: argparse.Namespace) -> int:
    from tally.reconciler.replay import replay

    with environment(options.stack, rules_file(options)):
        outcome = replay(say=lambda line: print(line, file=sys.stderr))
    print(json.dumps(outcome))
    return 0 if not outcome["failed"] else 1


def _invoke(options: argparse.Namespace) -> int:
    from tally.local import runner

    event = json.loads(options.event.read_text())
    invoke = runner.invoker(_running(), options.function, rules_file=rules_file(options))
    response = invoke(event)
    print(json.dumps(response, indent=2, default=str))
    return 0


def _demo(options: argparse.Namespace) -> int:
    from tally.local.demo import run_demo

    code: int = run_demo(STATE_DIR, keep=options.keep)
    return code


if __name__ == "__main__":
    sys.exit(main())
