"""What the live benchmarks (live_faults.py, live_index.py) share: the import path and the
handlers' environment, set before tally is imported, and the handlers' output sent to a log."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent


def prepare(metrics_namespace: str) -> Path:
    """Put the repository's sources first on the import path and default the environment as
    the tests run the handlers (Powertools reads it when the handler modules are imported);
    returns the repository's root."""
    sys.path[:0] = [str(REPO / "src"), str(REPO)]
    for name, value in {
        "TALLY_TEMPLATE": str(REPO / "template.yaml"),
        "POWERTOOLS_SERVICE_NAME": "tally",
        "POWERTOOLS_METRICS_NAMESPACE": metrics_namespace,
        "POWERTOOLS_TRACE_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }.items():
        os.environ.setdefault(name, value)
    return REPO


def handlers_output_to(log: Path) -> TextIO:
    """The handlers log to standard output: send it to ``log``; returns the terminal's
    standard output, for the report."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    with log.open("w") as opened:
        os.dup2(opened.fileno(), sys.stdout.fileno())
    return out


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """--json and --log, defaulting to benchmarks/results/<name>.json and .log."""
    parser.add_argument("--json", type=Path, default=REPO / f"benchmarks/results/{name}.json")
    parser.add_argument(
        "--log",
        type=Path,
        default=REPO / f"benchmarks/results/{name}.log",
        help="where the handlers' own output goes (their JSON logs and metrics)",
    )
