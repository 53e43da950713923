"""``tally repairs``: the repair switches (the kill switch, dry run, the per-invocation repair
budget) of the local stack or a deployed one, shown and flipped at run time. Every function
reads them within its cache time (REPAIR_SWITCHES_MAX_AGE_SECONDS, 30 s in the template)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import tally.cli.console as console
import tally.cli.targets as targets
from tally.cli.console import Failure
from tally.cli.options import EPILOG
from tally.reconciler.repair.switches import (
    MAX_BUDGET,
    State,
    Switches,
    SwitchesError,
    parse_switches,
)

STATES: dict[str, State] = {"on": "on", "off": "off", "dry-run": "dry_run"}


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "repairs",
        help="show or flip the repair switches: kill switch, dry run, budget",
        description="Show the repair switches, or flip them: `off` stops every repair "
        "(alerts continue), `dry-run` alerts what would be written, `on` repairs again; "
        "--budget sets the repairs one invocation may write. Every function reads them "
        "within its cache time (30 s in the template); no deploy.",
        epilog=EPILOG,
    )
    parser.add_argument("state", nargs="?", choices=list(STATES), help="flip repairs to this")
    parser.add_argument("--budget", type=budget, metavar="N", help="repairs per invocation")
    parser.add_argument(
        "--stack", metavar="NAME", help="a deployed stack (default: the local stack)"
    )
    parser.add_argument("--json", action="store_true", help="the switches as one JSON object")
    parser.set_defaults(run=repairs)


def budget(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_BUDGET:
        raise argparse.ArgumentTypeError(f"a whole number from 0 to {MAX_BUDGET}, not {text!r}")
    return value


def repairs(options: argparse.Namespace) -> int:
    from tally.core.aws import client

    with targets.environment(options.stack, None):
        name = os.environ.get("REPAIR_SWITCHES_PARAMETER")
        if not name:
            raise Failure(_unnamed(options.stack))
        ssm = client("ssm", config=targets.PREFLIGHT)
        source, unreadable = f"parameter {name}", ""
        try:
            text = ssm.get_parameter(Name=name)["Parameter"]["Value"]
        except ssm.exceptions.ParameterNotFound:
            raise Failure(f"{source} does not exist: is the stack deployed?") from None
        try:
            now: Switches | None = parse_switches(text, source)
        except SwitchesError as error:
            now, unreadable = None, str(error)
        state = STATES[options.state] if options.state else None
        if state is not None or options.budget is not None:
            if now is None and (state is None or options.budget is None):
                raise Failure(
                    f"{source} holds what the functions cannot read ({unreadable}), so they "
                    "repair nothing; name both a state and --budget N to write it whole"
                )
            base = now or Switches(False, False, 0, source)
            try:
                now = base.switched(state, options.budget)
            except SwitchesError as error:
                raise Failure(str(error)) from None
            ssm.put_parameter(Name=name, Value=now.value(), Type="String", Overwrite=True)
            console.note(
                "repairs: every function reads this within its cache time "
                "(REPAIR_SWITCHES_MAX_AGE_SECONDS, 30 s in the template)"
            )
    shown = now or Switches.failing_safe(source, unreadable)
    if options.json:
        print(json.dumps(shown.as_json()))
    else:
        print(shown.describe())
    return 0


def _unnamed(stack: str | None) -> str:
    if stack:
        return (
            f"stack {stack} has no RepairSwitchesParameter output: deploy this version of the "
            "template (its repair switches are still template parameters there)"
        )
    return (
        "no repair switches to flip: the local stack predates them (`tally local down`, then "
        "`tally local up`), or name a deployed stack with --stack NAME"
    )
