"""``tally rules filter|check|suggest``: a rules file turned into the stream filter, checked
against a live table, or proposed from one (docs/adopting.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

import tally.cli.targets as targets
from tally.cli.console import Failure
from tally.cli.options import EPILOG, rules_file, rules_option, target_options
from tally.rules import RulesFileError, load_rules


def register(commands: Any) -> None:
    rules = commands.add_parser(
        "rules",
        help="the stream filter; rules checked or proposed",
        description="The stream filter the rules need; the rules checked against a live "
        "table, or proposed from one (docs/adopting.md).",
        epilog=EPILOG,
    )
    actions = rules.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(
            name, help=summary, description=description, epilog=EPILOG
        )
        return parser

    filter_ = action(
        "filter",
        "the stream's FilterCriteria pattern",
        "Print the stream's FilterCriteria pattern for these rules: only items some rule "
        "cares about reach the reconciler (the template's StreamFilterPattern).",
    )
    rules_option(filter_)
    filter_.add_argument(
        "--global-table",
        action="store_true",
        help="admit the Regions' heartbeats too (a stack deployed with GlobalRegions)",
    )
    filter_.set_defaults(run=_filter)

    check = action(
        "check",
        "the rules against a live table and a sample",
        "Check the rules against the target table and a sample of its items: parents "
        "without a counter or with one that is not a number, items no rule counts; "
        "exits 1 when it flags anything.",
    )
    target_options(check)
    check.add_argument("--sample", type=_positive, default=1000, help="items to scan (1000)")
    check.add_argument("--json", action="store_true", help="the report as JSON")
    check.set_defaults(run=_check)

    suggest = action(
        "suggest",
        "rules read off a sample, as TOML to review",
        "Propose rules read off a sample of the target table: counters that equal a count, "
        "sum or highest number of their items, as a rules file to review; exits 1 when it "
        "finds none.",
    )
    target_options(suggest)
    suggest.add_argument("--sample", type=_positive, default=200, help="items to scan (200)")
    suggest.add_argument(
        "--json", action="store_true", help="the proposals and the rules file as JSON"
    )
    suggest.set_defaults(run=_suggest)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 up, got {text!r}")
    return int(text)


def _filter(options: argparse.Namespace) -> int:
    from tally.rules.stream_filter import filter_json

    with targets.environment(None, rules_file(options)):
        rules = load_rules()
    try:
        print(filter_json(rules, heartbeats=options.global_table))
    except ValueError as error:  # a key the heartbeat cannot be written under
        raise Failure(f"--global-table: {error}") from None
    return 0


def _check(options: argparse.Namespace) -> int:
    from tally.cli.rules_check import check
    from tally.core.aws import client

    with targets.environment(options.stack, rules_file(options)):
        table = _table()
        try:
            rules = load_rules()
        except RulesFileError as error:
            print(f"flag: {error}")
            return 1
        try:
            report = check(rules, client("dynamodb"), table, options.sample)
        except (BotoCoreError, ClientError) as error:
            raise Failure(f"table {table}: {error}") from None
    if options.json:
        print(json.dumps(report.as_json()))
    else:
        import tally.cli.console as console

        console.out.print("\n".join(report.heading()), markup=False)
        if report.rules:
            counts = report.COLUMNS[2:]
            console.out.print(console.table(report.COLUMNS, report.rows(), right=counts))
        console.out.print("\n".join(report.footing()), markup=False)
    return 1 if report.flags else 0


def _suggest(options: argparse.Namespace) -> int:
    from tally.cli.rules_suggest import render, suggest
    from tally.core.aws import client
    from tally.rules.live_table import describe, sample

    with targets.environment(options.stack, None):
        table = _table()
        dynamodb = client("dynamodb")
        try:
            shape = describe(dynamodb, table)
            items = sample(dynamodb, table, options.sample)
            proposals = suggest(dynamodb, shape, items, options.sample)
        except (BotoCoreError, ClientError) as error:
            raise Failure(f"table {table}: {error}") from None
    if options.json:
        found = [
            {
                "kind": p.shape.kind,
                "parent_sort_key": p.shape.parent_sk,
                "counter": p.shape.counter,
                "items_prefix": p.shape.span,
                "parents_sampled": len(p.parents),
                "parents_holding": p.held,
            }
            for p in proposals
        ]
        rules_toml = render(table, len(items), shape.keys, proposals) if proposals else None
        print(
            json.dumps(
                {"table": table, "sampled": len(items), "proposals": found, "rules": rules_toml}
            )
        )
    if not proposals:
        print(
            f"tally: no counter in {len(items)} sampled items of {table} equals a count, sum or "
            "highest number of its items; sample more (--sample) or write the rules by hand",
            file=sys.stderr,
        )
        return 1
    if not options.json:
        print(render(table, len(items), shape.keys, proposals), end="")
    return 0


def _table() -> str:
    return targets.table_name()
