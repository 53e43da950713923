"""The ``tally`` command's entry point: its arguments, parsed, and the command they name run
(local stack commands in ``local_commands``, operator commands in ``operate``, rules commands
in ``rules``).

Commands work on the local stack (``tally local up``), on a deployed stack
(``--stack NAME``), or on whatever ``TABLE_NAME``/``AUDIT_TABLE_NAME``/... the environment
already names. The project (template.yaml, src/rules.toml) is the working directory's, or
the one ``--template`` names. The rules file is ``--rules``, else
``RULES_FILE``, else the local stack's, else the one the template bundles.
"""

from __future__ import annotations

import argparse
import functools
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import shtab

import tally.cli.console as console
import tally.cli.local_commands as local_commands
import tally.cli.operate as operate
from tally.cli.options import (
    EPILOG,
    MAX_SEGMENTS,
    completes,
    key_argument,
    named_file,
    positive_seconds,
    rules_option,
    segment_count,
    target_options,
)
from tally.cli.regions import lag_argument, regions_argument, skew_argument
from tally.cli.repairs import register as register_repairs
from tally.cli.rules import register as register_rules
from tally.local import dynamodb_local
from tally.local.regions import DEFAULT_LAG_MEDIAN_MS, DEFAULT_LAG_P99_MS


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
    template = project.add_argument(
        "--template",
        type=Path,
        metavar="PATH",
        help="tally's own template: its functions, tables and rules (default: ./template.yaml)",
    )
    completes(template, shtab.FILE)

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
        parser.set_defaults(run=local_commands.local)
        return parser

    up = local_action(
        "up",
        "start the local stack, or find it running",
        "Start DynamoDB Local and moto's server (SNS, SQS) on loopback and create the "
        "template's table, audit table, queues and alert topic; a stack already running is "
        "reused. Prints the variables `tally local env` prints.",
    )
    own_template = up.add_argument(
        "--template",
        type=Path,
        dest="table_template",
        metavar="PATH",
        help="the counted table from your own template (default: template.yaml's Table; "
        "with --rules alone, a table with the rules' [table] keys)",
    )
    completes(own_template, shtab.FILE)
    up.add_argument(
        "--table-id",
        metavar="ID",
        help="with --template: its table's logical id (default: its only table)",
    )
    rules_option(up)
    up.add_argument(
        "--regions",
        type=regions_argument,
        metavar="R1,R2[,R3]",
        help="a multi-Region stack: the counted table replicated between these Regions as a "
        "Global Table, a DynamoDB Local each (docs/global-tables.md)",
    )
    up.add_argument(
        "--lag-ms",
        type=lag_argument,
        metavar="N",
        help="with --regions: every change takes N ms to replicate (default: drawn, median "
        f"{DEFAULT_LAG_MEDIAN_MS} ms, p99 {DEFAULT_LAG_P99_MS} ms)",
    )
    up.add_argument(
        "--skew-ms",
        type=skew_argument,
        metavar="R=MS[,R=MS]",
        help="with --regions: a Region's clock runs MS ms ahead (negative: behind), so its "
        "writes win (or lose) last-writer-wins races they would not",
    )
    up.add_argument(
        "--consistency",
        choices=["eventual", "strong"],
        help="with --regions: eventual (MREC, the default) or strong (MRSC: three Regions, "
        "one DynamoDB Local, no transactions, no TTL)",
    )
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
    env.add_argument(
        "--region",
        metavar="R",
        help="on a multi-Region stack: this Region's variables (default: the first Region's)",
    )
    for other in (down, env):
        # Options of `up` given to another action are usage errors that say where they go.
        other.add_argument("--template", type=Path, dest="table_template", help=argparse.SUPPRESS)
        other.add_argument("--table-id", help=argparse.SUPPRESS)
        other.add_argument("--rules", type=Path, help=argparse.SUPPRESS)
        other.add_argument("--regions", help=argparse.SUPPRESS)
        other.add_argument("--lag-ms", help=argparse.SUPPRESS)
        other.add_argument("--skew-ms", help=argparse.SUPPRESS)
        other.add_argument("--consistency", help=argparse.SUPPRESS)

    pump = command("pump", "play Lambda's stream and recheck-queue triggers locally")
    rules_option(pump)
    pump.add_argument("--until-idle", action="store_true", help="stop once all is delivered")
    pump.add_argument(
        "--max-seconds",
        type=positive_seconds,
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
        "--region",
        metavar="R",
        help="on a multi-Region stack: this Region's stream and queues alone (default: every "
        "Region's, a pump each)",
    )
    pump.add_argument(
        "--json", action="store_true", help="when it stops: its report as one JSON object"
    )
    pump.set_defaults(run=local_commands.pump)

    audit = command("audit", "full audit of every rule, one rule or one parent")
    audit.add_argument("--rule", metavar="NAME", help="only this rule")
    audit.add_argument(
        "--parent", type=key_argument, metavar="KEY", help="only this parent: PK=POST#a91f,SK=META"
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
        type=segment_count,
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
    export_path = audit.add_argument(
        "--export",
        type=Path,
        metavar="PATH",
        help="with --engine duckdb: the export to audit, or a directory above exports: the "
        "newest of the target's table is audited",
    )
    completes(export_path, shtab.DIRECTORY)
    audit.add_argument(
        "--export-of-another-table",
        action="store_true",
        help="with --export: audit an export of another table than the target's (refused "
        "otherwise; its findings are judged against the target's live table)",
    )
    audit.add_argument("--json", action="store_true", help="the report and findings as JSON")
    target_options(audit)
    audit.set_defaults(run=operate.audit)

    export = command("export", "write the table in DynamoDB's export layout")
    out = export.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="directory to write it under"
    )
    completes(out, shtab.DIRECTORY)
    export.add_argument(
        "--segments",
        type=segment_count,
        default=4,
        metavar="N",
        help=f"parallel scan segments, 1 to {MAX_SEGMENTS} (default 4)",
    )
    export.add_argument(
        "--json", action="store_true", help="the export's directory, id and item count as JSON"
    )
    target_options(export)
    export.set_defaults(run=operate.export)

    alerts = command("alerts", "alerts the local stack's subscriber received")
    alerts.add_argument("--follow", action="store_true", help="keep printing new ones")
    alerts.add_argument("--json", action="store_true", help="one JSON object per line")
    alerts.set_defaults(run=local_commands.alerts)

    replay = command("replay", "re-verify the batches on the stream's on-failure queue")
    target_options(replay)
    replay.set_defaults(run=operate.replay)

    invoke = command("invoke", "invoke a template function in process on the local stack")
    invoke.add_argument("function", help="its logical id in template.yaml, e.g. ReconcilerFunction")
    event = invoke.add_argument("event", type=Path, help="an event JSON file, e.g. from events/")
    completes(event, shtab.FILE)
    rules_option(invoke)
    invoke.set_defaults(run=local_commands.invoke)

    register_rules(commands)
    register_repairs(commands)

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
    examples.set_defaults(run=local_commands.examples)

    demo = command("demo", "the end-to-end demo, on a local stack of its own")
    demo.add_argument("--keep", action="store_true", help="leave the demo's stack running")
    demo.set_defaults(run=local_commands.demo)

    ddb = command(
        "dynamodb-local", "fetch DynamoDB Local, or run it in the foreground", parents=False
    )
    ddb.add_argument("action", choices=["fetch", "run"])
    ddb.add_argument(
        "--port", type=dynamodb_local.port_number, default=8000, help="with run (default 8000)"
    )
    ddb.set_defaults(run=local_commands.dynamodb_local)

    completion = command(
        "completion",
        "print tally's tab completion script for a shell",
        parents=False,
    )
    completion.add_argument(
        "shell",
        choices=shtab.SUPPORTED_SHELLS,
        help="e.g. bash: tally completion bash > ~/.local/share/bash-completion/completions/tally",
    )
    completion.set_defaults(run=functools.partial(_completion, parser))
    return parser


def _completion(parser: argparse.ArgumentParser, options: argparse.Namespace) -> int:
    # Generated from the parser itself: a command or option added later completes too.
    print(shtab.complete(parser, shell=options.shell))
    return 0


def _version() -> str:
    try:
        return version("tally-reconciler")
    except PackageNotFoundError:
        return "(not installed)"


if __name__ == "__main__":
    sys.exit(main())
