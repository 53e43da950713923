"""What the ``tally`` command shows: errors as one-line messages with exit codes, progress
bars and live status on a terminal only, and tables.

Exit codes: 0 clean, 1 findings or a failure (nothing to reach, nothing configured), 2 a
usage or input mistake (the command line, or a rules file or template it reads, is wrong).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)
from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from tally.core.settings import SettingsError
from tally.local.dynamodb_local import DynamoDBLocalUnavailable
from tally.local.stack_record import LocalStackError
from tally.local.tables import ALERT_COLUMNS, ALERT_WIDTHS, alert_row, pattern, plain, table
from tally.local.template import TemplateError, TemplateNotFoundError
from tally.reconciler.findings import Finding, Off
from tally.rules import RulesFileError

FAILED, USAGE = 1, 2

# Piped output is not wrapped at 80 columns: a table row stays one line for grep and diff.
_PIPED_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 240
out = Console(highlight=False, width=_PIPED_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class UsageError(Exception):
    """The command line names something wrong; the message says what and what is allowed."""


class Failure(Exception):
    """The command cannot do its job; the message says why and what to do."""


def _no_target(error: Exception) -> str:
    return (
        f"{error}: say what to work on: start the local stack (`tally local up`), "
        "pass --stack NAME, or export the variables `tally local env` prints"
    )


def _client_error(error: ClientError) -> str:
    details = error.response.get("Error", {})
    return f"{error.operation_name}: {details.get('Code')}: {details.get('Message')}"


def _unreachable(error: Exception) -> str:
    endpoint = getattr(error, "kwargs", {}).get("endpoint_url", "the endpoint")
    return f"cannot reach {endpoint} ({error}); is it running? (`tally local up` for local mode)"


# First match wins: subclasses before their bases.
_ERRORS: list[tuple[tuple[type[BaseException], ...], int, Callable[[Any], str]]] = [
    ((UsageError, TemplateNotFoundError, TemplateError, RulesFileError), USAGE, str),
    ((Failure, LocalStackError, DynamoDBLocalUnavailable), FAILED, str),
    ((SettingsError,), FAILED, _no_target),
    (
        (NoRegionError,),
        FAILED,
        lambda _: "no AWS region: set AWS_DEFAULT_REGION or a region in your AWS profile",
    ),
    (
        (NoCredentialsError, PartialCredentialsError),
        FAILED,
        lambda _: (
            "no AWS credentials: configure a profile (aws configure, AWS_PROFILE) or, "
            'for the local stack, eval "$(tally local env)"'
        ),
    ),
    ((EndpointConnectionError, ConnectTimeoutError), FAILED, _unreachable),
    ((ClientError,), FAILED, _client_error),
    ((BotoCoreError,), FAILED, str),
]


def run(command: Callable[[], int]) -> int:
    """Run a command; a known error becomes ``tally: <message>`` and its exit code."""
    try:
        return command()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`tally alerts --json | head`): as a shell tool does, stop
        # quietly, and keep Python from failing again on flushing the closed pipe at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as error:
        for kinds, code, message in _ERRORS:
            if isinstance(error, kinds):
                print(f"tally: {message(error)}", file=sys.stderr)
                return code
        raise


def note(line: str) -> None:
    """A line for the operator, on stderr (above a live display, if one is drawn)."""
    err.print(line, markup=False)


@contextmanager
def progress(what: str, total: int | None, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """A progress bar towards ``total`` (an estimate may be passed), drawn on a terminal only."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not (enabled and err.is_terminal),
    )
    with bar:
        task = bar.add_task(what, total=total)

        def advance(amount: int) -> None:
            bar.advance(task, amount)
            # Item counts are estimates (DynamoDB refreshes them about every six hours).
            done = bar.tasks[task].completed
            if total is not None and done > (bar.tasks[task].total or 0):
                bar.update(task, total=done)

        yield advance


def waiting(what: str, sleep: Callable[[float], None] = time.sleep) -> Callable[[float], None]:
    """A sleep that says ``what`` it waits for and until when: one line, then a countdown
    on a terminal."""

    def wait(seconds: float) -> None:
        until = datetime.now(UTC) + timedelta(seconds=seconds)
        note(f"{what}: waiting {seconds:g} s, until {until:%H:%M:%S} UTC")
        end = time.monotonic() + seconds
        if not err.is_terminal:
            sleep(seconds)
            return
        with Live(console=err, transient=True, auto_refresh=False) as shown:
            while (left := end - time.monotonic()) > 0:
                shown.update(Text(f"  {math.ceil(left)} s left"), refresh=True)
                sleep(min(1.0, left))

    return wait


def live(render: Callable[[], RenderableType]) -> Any:
    """A status redrawn in place while the block runs, on a terminal only."""
    if not err.is_terminal:
        return nullcontext()
    return Live(get_renderable=render, console=err, transient=True, refresh_per_second=4)


def print_audit(
    report: dict[str, Any],
    findings: list[Finding],
    repair: bool,
    alerted: bool,
    state: Sequence[Off] = (),
) -> None:
    rows = []
    for name in report["rules"]:
        mine = [f for f in findings if f.rule == name]
        kinds = [f.kind for f in mine]
        repaired = sum(1 for f in mine if f.repair and f.repair.status == "applied")
        other = len(kinds) - kinds.count("drift") - kinds.count("gap")
        row = [report["parents_checked"].get(name, 0), kinds.count("drift"), kinds.count("gap")]
        rows.append([name, *row, other, repaired])
    counts = ("checked", "drift", "gaps", "other", "repaired")
    out.print(table(("rule", *counts), rows, right=counts))
    shown = list(state) or [Off(f, "new") for f in findings]
    if shown:
        columns = ("kind", "rule", "parent", "stored", "actual", "repair", "status")
        found = []
        for off in shown:
            f = off.finding
            where = pattern(f.key) + (f" #{f.number}" if f.number is not None else "")
            status = off.status + (f" since {off.alerted_at}" if off.alerted_at else "")
            found.append([f.kind, f.rule, where, f.stored, f.actual, _done(f), status])
        out.print(table(columns, found))
    export = report.get("export")
    read = (
        f"{export['items']} items exported"
        if export
        else f"{report['items_scanned']} items scanned"
    )
    summary = (
        f"{read}, {report['recounted']} parents recounted, "
        f"{report['sequences_checked']} sequences checked, {len(findings)} findings, "
        + (f"{len(shown)} parents off, " if len(shown) != len(findings) else "")
        + f"{report['seconds']} s"
        + ("" if shown else ": clean")
    )
    out.print(summary, markup=False)
    if findings and not repair:
        published = "alerts published" if alerted else "no alert published (--alert publishes)"
        out.print(f"dry run: nothing written, {published}; --repair repairs", markup=False)


def _done(finding: Finding) -> str:
    """What the audit did, or would do, about a finding."""
    repair = finding.repair
    if repair is None:
        return "nothing"
    if repair.status in ("applied", "dry_run"):
        verb = "set" if repair.status == "applied" else "would set"
        if repair.after == "VOID":
            return f"{verb} number {finding.number} VOID"
        return f"{verb} {finding.attribute} {plain(repair.before)} -> {plain(repair.after)}"
    return f"{repair.status}: {repair.reason}"


__all__ = ["ALERT_COLUMNS", "ALERT_WIDTHS", "alert_row", "pattern", "table"]
