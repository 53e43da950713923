"""The calls a recording holds (TALLY_RECORD_CALLS), by function, and whether the template's
policies allow each: ``python -m tests.harness.iam_report calls.jsonl [--existing]``.
Exit code 1 when some call would be refused."""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from tests.harness.iam import EXAMPLE, EXISTING, Deployment, NotModelled, denials, request_of
from tests.harness.iam_calls import Call, load


def summary(calls: list[Call], deployment: Deployment) -> str:
    """One line per function, action and resource: where the code makes the call."""
    rows: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for call in calls:
        try:
            resource = request_of(call, deployment).resource
        except NotModelled:
            resource = call.resource
        rows[(call.function, call.action, resource)].add(call.site.split(" < ")[0])
    return "\n".join(
        f"{function}  {action}  {resource}  ({', '.join(sorted(sites))})"
        for (function, action, resource), sites in sorted(rows.items())
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("calls", type=Path)
    parser.add_argument("--existing", action="store_true", help="deploy on an existing table")
    options = parser.parse_args(argv)
    deployment = Deployment(EXISTING if options.existing else EXAMPLE)
    calls = load(options.calls)
    print(summary(calls, deployment))
    refused = denials(calls, deployment)
    for line in refused:
        print("REFUSED", line, file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
