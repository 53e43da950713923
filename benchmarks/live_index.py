"""The live scenario for children found through an index, run N times, with its goal lines.

The application writes follow edges (follow, unfollow, re-point, block, unblock; each
transactional with its counters) and cart lines from a process of its own; the
shopping-cart aggregator keeps product totals late; the pump verifies while the index lags
(tests/harness/index_lag.py); an injector breaks followee counts and product totals
(tests/harness/live_index.py). Each run counts false negatives, false positives, lost
writes and harmful writes; fault -> alert latencies are pooled over the runs per fault kind;
the reconciler's read and write units per 1,000 edge (line) writes (the table, its indexes
and the audit table) are set against a naive recount (one eventually consistent Query of
each touched followee (product) per write, costed by running it on the final table with
ReturnConsumedCapacity), and in dollars against the writers' own writes. Prints the table
and the goal lines, writes the JSON.

    python benchmarks/live_index.py --runs 3

Uses ``DYNAMODB_ENDPOINT`` / ``AWS_ENDPOINT_URL_DYNAMODB`` when set, else its own DynamoDB
Local; SNS and SQS come from moto's server on loopback. Exit 1 if a goal is missed (the
goals are the counts; latency and read units are reported).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from live_setup import add_output_arguments, handlers_output_to, prepare

REPO = prepare("TallyLiveIndex")

from tally.local.dynamodb_local import DynamoDBLocal  # noqa: E402
from tally.local.moto_server import moto_server  # noqa: E402
from tests.harness.endpoints import endpoint_from_env  # noqa: E402
from tests.harness.live import format_latency, latency_table  # noqa: E402
from tests.harness.live_index import (  # noqa: E402
    LiveIndexRun,
    Outcome,
    index_stack,
    pooled,
)

# On-demand prices in us-east-1 since November 2024, dollars per request unit.
READ_UNIT, WRITE_UNIT = 0.125e-6, 0.625e-6
# What the writers' own writes cost per child write: a follow is a TransactWriteItems of the
# edge and the followee's counter (two items, transactional: 2 write units each); a cart line
# is a plain put (1) that the aggregator later ADDs to its product's total (1).
OWN_WRITE_UNITS = {"followers": 4.0, "products": 2.0}


def cost_summary(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    """Per rule, over every run: child writes, the reconciler's read and write units (the
    table, its indexes and the audit table), per child write, and in dollars against the
    writers' own writes and a naive index query per write."""
    summary: dict[str, dict[str, float]] = {}
    for rule in ("followers", "products"):
        writes = max(sum(o.cost[rule]["writes"] for o in outcomes), 1)
        reads = sum(o.cost[rule]["reconciler"] for o in outcomes)
        written = sum(o.cost[rule].get("reconciler_write_units", 0.0) for o in outcomes)
        naive = sum(o.cost[rule]["naive"] for o in outcomes)
        dollars = reads * READ_UNIT + written * WRITE_UNIT
        summary[rule] = {
            "writes": writes,
            "reconciler_ru": round(reads, 1),
            "reconciler_wu": round(written, 1),
            "naive_ru": round(naive, 1),
            "reconciler_per_1000": round(1000 * reads / writes, 1),
            "reconciler_wu_per_1000": round(1000 * written / writes, 1),
            "units_per_write": round((reads + written) / writes, 2),
            "naive_per_1000": round(1000 * naive / writes, 1),
            "naive_units_per_write": round(naive / writes, 2),
            "dollars_per_million_writes": round(1e6 * dollars / writes, 2),
            "own_dollars_per_million_writes": round(1e6 * OWN_WRITE_UNITS[rule] * WRITE_UNIT, 2),
            "naive_dollars_per_million_writes": round(1e6 * naive * READ_UNIT / writes, 2),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs (default 3), seeds 1..N")
    parser.add_argument("--followers", type=int, default=4, help="follow writer threads")
    parser.add_argument("--carts", type=int, default=2, help="cart writer threads")
    parser.add_argument("--operations", type=int, default=50, help="writes per writer thread")
    parser.add_argument("--lag", type=float, default=1.5, help="index lag, seconds (1.5)")
    parser.add_argument("--jitter", type=float, default=0.3, help="lag jitter, seconds (0.3)")
    parser.add_argument(
        "--split-shards",
        action="store_true",
        help="deliver each stream batch as two by partition key hash, as DynamoDB's shards "
        "would (a transaction's edge and counter then arrive apart)",
    )
    add_output_arguments(parser, "live_index")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.operations < 1 or min(args.followers, args.carts) < 0:
        parser.error("--runs and --operations are at least 1, thread counts at least 0")
    if not 0 <= args.jitter <= args.lag:
        parser.error("--jitter must be between 0 and --lag")

    out = handlers_output_to(args.log)
    results: dict[str, Any] = {"runs": {}}
    outcomes: list[Outcome] = []
    with contextlib.ExitStack() as exits:
        endpoint = endpoint_from_env() or exits.enter_context(DynamoDBLocal()).endpoint
        moto = exits.enter_context(moto_server())
        for seed in range(1, args.runs + 1):
            with index_stack(endpoint, moto) as stack:
                outcome = LiveIndexRun(
                    stack,
                    seed=seed,
                    followers=args.followers,
                    carts=args.carts,
                    operations=args.operations,
                    lag=args.lag,
                    jitter=args.jitter,
                    split_shards=args.split_shards,
                ).run()
            print(f"run {seed}: {outcome.describe()}", file=out)
            outcomes.append(outcome)
            results["runs"][f"run-{seed}"] = outcome.as_json()
    table = latency_table(pooled(outcomes))
    results["latency"] = table
    print(f"\n{args.runs} runs: fault -> alert latency", file=out)
    print(format_latency(table), file=out)
    cost = cost_summary(outcomes)
    results["cost"] = cost
    for rule, row in cost.items():
        print(
            f"  {rule}: {row['writes']:.0f} writes; reconciler {row['reconciler_per_1000']} RU "
            f"and {row['reconciler_wu_per_1000']} WU per 1,000 ({row['units_per_write']} units "
            f"a write, ${row['dollars_per_million_writes']} per million writes); naive index "
            f"query {row['naive_per_1000']} RU per 1,000 ({row['naive_units_per_write']} units, "
            f"${row['naive_dollars_per_million_writes']}); the writers' own writes "
            f"${row['own_dollars_per_million_writes']} per million",
            file=out,
        )
    totals = [sum(o.counts()[n] for o in outcomes) for n in range(4)]
    met = not any(totals)
    line = (
        "false negatives, false positives, lost writes, harmful writes: "
        f"{', '.join(map(str, totals))} (goal 0 each)"
    )
    results["goals"] = [{"goal": line, "met": met}]
    print(f"  {'MET   ' if met else 'MISSED'} {line}", file=out)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, sort_keys=True))
    print(f"\nJSON: {args.json}; the handlers' output: {args.log}", file=out)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
