"""The live fault scenario, run N times per ParallelizationFactor, with its goal lines.

The application's writer threads write from a process of their own, the pump verifies at
the factor given, an injector breaks parents
(count, sum and sequence faults, on small and hot parents) and code "not ours" deletes and
reuses parents (tests/harness/live.py). Each run counts false negatives, false positives,
lost writes and harmful writes; the fault -> alert latencies of every run of a factor are
pooled per fault kind. Prints the table and the goal lines, writes the JSON.

    python benchmarks/live_faults.py --runs 3 --factors 1,2,10

Uses ``DYNAMODB_ENDPOINT`` / ``AWS_ENDPOINT_URL_DYNAMODB`` when set, else its own DynamoDB
Local; SNS and SQS come from moto's server on loopback. Exit 1 if a goal is missed.
The pump, the handlers, the injector and the subscriber share this process; the writers do
not, as in production. On a loaded machine the latencies include waiting for a core;
`--writers` lowers the load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from typing import Any

from live_setup import add_output_arguments, handlers_output_to, prepare

REPO = prepare("TallyLiveFaults")

from tally.local.dynamodb_local import DynamoDBLocal  # noqa: E402
from tally.local.functions import parameter_defaults  # noqa: E402
from tally.local.moto_server import moto_server  # noqa: E402
from tally.local.template import load_template, template_path  # noqa: E402
from tally.rules import load_rules  # noqa: E402
from tests.harness.endpoints import endpoint_from_env  # noqa: E402
from tests.harness.live import (  # noqa: E402
    LIFECYCLE,
    LiveRun,
    Outcome,
    format_latency,
    latency_table,
    live_stack,
)

RULES_FILE = REPO / "tests/integration/rules.toml"
SMALL_MEDIAN, SMALL_MAX, HOT_MARGIN = 1.5, 3.0, 2.0


def goals(outcomes: list[Outcome], carry_seconds: float) -> list[tuple[str, bool]]:
    """The goal lines of one factor's runs: (line, met)."""
    pooled: dict[str, list[float]] = {}
    for outcome in outcomes:
        for kind, values in outcome.latencies.items():
            pooled.setdefault(kind, []).extend(values)
    small = pooled.get("count/small", []) + pooled.get("sum/small", [])
    hot = pooled.get("count/hot", [])
    totals = [sum(o.counts()[n] for o in outcomes) for n in range(4)]
    lines = [
        (
            "false negatives, false positives, lost writes, harmful writes: "
            f"{', '.join(map(str, totals))} (goal 0 each)",
            not any(totals),
        )
    ]
    if small:
        median, worst = statistics.median(small), max(small)
        lines.append(
            (
                f"count and sum faults on parents <=100 children: median {median:.2f} s, "
                f"max {worst:.2f} s (goal: median <= {SMALL_MEDIAN} s, max <= {SMALL_MAX} s)",
                median <= SMALL_MEDIAN and worst <= SMALL_MAX,
            )
        )
    if hot:
        bound = carry_seconds + HOT_MARGIN
        lines.append(
            (
                f"hot parents: max {max(hot):.2f} s (goal: within window + {HOT_MARGIN:g} s "
                f"= {bound:g} s)",
                max(hot) <= bound,
            )
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per factor (default 3)")
    parser.add_argument("--factors", default="1", help="comma-separated, e.g. 1,2,10")
    parser.add_argument("--writers", type=int, default=6, help="writer threads (default 6)")
    parser.add_argument("--operations", type=int, default=30, help="writes per writer thread")
    parser.add_argument(
        "--lifecycle",
        default=",".join(LIFECYCLE),
        help="comma-separated lifecycle scenarios, or 'none' (default: all)",
    )
    add_output_arguments(parser, "live_faults")
    args = parser.parse_args(argv)
    try:
        factors = [int(f) for f in args.factors.split(",")]
    except ValueError:
        parser.error(f"--factors: not a list of numbers: {args.factors!r}")
    if any(not 1 <= f <= 10 for f in factors) or args.runs < 1:
        parser.error("--factors are 1 to 10 and --runs at least 1")
    lifecycle = [] if args.lifecycle == "none" else args.lifecycle.split(",")
    unknown = set(lifecycle) - set(LIFECYCLE)
    if unknown:
        parser.error(f"--lifecycle: unknown scenarios {sorted(unknown)}; known: {LIFECYCLE}")
    rules = load_rules(RULES_FILE)
    carry_seconds = float(parameter_defaults(load_template(template_path()))["CarrySeconds"])

    # The handlers log to standard output: that goes to --log, the report to the terminal.
    out = handlers_output_to(args.log)
    results: dict[str, Any] = {"runs": {}, "latency": {}, "goals": {}}
    met_all = True
    with contextlib.ExitStack() as exits:
        endpoint = endpoint_from_env() or exits.enter_context(DynamoDBLocal()).endpoint
        moto = exits.enter_context(moto_server())
        for factor in factors:
            outcomes = []
            for run in range(1, args.runs + 1):
                with live_stack(endpoint, moto, RULES_FILE) as stack:
                    outcome = LiveRun(
                        stack,
                        rules,
                        seed=run,
                        factor=factor,
                        lifecycle=lifecycle,
                        writers=args.writers,
                        operations=args.operations,
                    ).run()
                print(f"factor {factor} run {run}: {outcome.describe()}", file=out)
                outcomes.append(outcome)
                results["runs"][f"factor-{factor}-run-{run}"] = outcome.as_json()
            pooled: dict[str, list[float]] = {}
            for outcome in outcomes:
                for kind, values in outcome.latencies.items():
                    pooled.setdefault(kind, []).extend(values)
            table = latency_table(pooled)
            results["latency"][f"factor-{factor}"] = table
            print(f"\nfactor {factor}, {args.runs} runs: fault -> alert latency", file=out)
            print(format_latency(table), file=out)
            lines = goals(outcomes, carry_seconds)
            results["goals"][f"factor-{factor}"] = [
                {"goal": line, "met": met} for line, met in lines
            ]
            for line, met in lines:
                print(f"  {'MET   ' if met else 'MISSED'} {line}", file=out)
                met_all &= met
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, sort_keys=True))
    print(f"\nJSON: {args.json}; the handlers' output: {args.log}", file=out)
    return 0 if met_all else 1


if __name__ == "__main__":
    sys.exit(main())
