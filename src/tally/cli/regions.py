"""The ``tally`` commands on a multi-Region local stack (`tally local up --regions`): starting
it, choosing a Region (``--region``), and pumping every Region at once."""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import tally.cli.console as console
from tally.cli.console import UsageError
from tally.local import regions as local_regions
from tally.local import stack_record
from tally.local.stack_record import LocalStack
from tally.local.state import SAM_ENV_FILE


def regions_argument(text: str) -> tuple[str, ...]:
    try:
        return local_regions.parse_regions(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def lag_argument(text: str) -> int:
    try:
        return local_regions.parse_lag(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def skew_argument(text: str) -> tuple[tuple[str, int], ...]:
    try:
        return local_regions.parse_skew(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def up(options: argparse.Namespace, state_dir: Path, table_id: str, rules: Path | None) -> int:
    """`tally local up --regions ...`: start the stack, say what runs where, print the first
    Region's exports."""
    try:
        layout = local_regions.Layout(
            options.regions,
            options.consistency or "eventual",
            options.lag_ms,
            options.skew_ms or (),
        )
    except ValueError as error:
        raise UsageError(f"--regions {','.join(options.regions)}: {error}") from None
    databases = "one DynamoDB Local" if layout.consistency == "strong" else "a DynamoDB Local each"
    stack = local_regions.up(
        state_dir,
        layout,
        rules_file=rules,
        template=options.table_template,
        table_id=table_id,
        starting=lambda: console.note(
            f"local stack: starting {', '.join(layout.regions)} ({databases}), the replication "
            "emulator in front of them and moto's server (SNS, SQS), then creating each "
            "Region's tables, queues and alert topic (some seconds)"
        ),
    )
    state = "already running" if stack.already_running else "up"
    assert stack.replication is not None
    endpoints = ", ".join(f"{r.region} {r.dynamodb_endpoint}" for r in (stack, *stack.replicas))
    console.note(
        f"local stack {state}: {stack.replication.describe()}; DynamoDB {endpoints}; SNS/SQS "
        f"{stack.moto_endpoint}; `sam local invoke` variables (of {stack.region}) in "
        f"{state_dir / SAM_ENV_FILE}"
    )
    first_region_note(stack, "local up")
    print(stack_record.exports(stack))
    return 0


def chosen(stack: LocalStack, region: str | None) -> LocalStack:
    """The stack as ``region`` sees it (None: as it is); UsageError when it has no such Region."""
    if region is None:
        return stack
    if stack.replication is None:
        raise UsageError(
            f"--region {region}: the local stack runs one Region ({stack.region}); "
            "`tally local up --regions A,B` starts several"
        )
    try:
        return stack.in_region(region)
    except LookupError as error:
        raise UsageError(f"--region {region}: {error}") from None


def first_region_note(stack: LocalStack, command: str) -> None:
    """On a multi-Region stack, say that the variables printed are the first Region's."""
    if stack.replication is not None:
        console.note(
            f"{command}: the variables of {stack.region}, the first of the stack's Regions "
            f"({', '.join(stack.regions)}); `tally local env --region R` prints another's"
        )


def pump_every_region(stack: LocalStack, options: argparse.Namespace, rules: Path | None) -> int:
    """`tally pump` on a multi-Region stack: a `tally pump --region R` per Region, each in a
    process of its own (the handlers read their Region from the environment and keep their
    clients), its messages prefixed with its Region. A signal is passed on to each; without
    --until-idle, one that ends with an error stops the others. The exit code is the worst."""
    given = [f"--max-seconds={options.max_seconds!r}"]
    given += ["--until-idle"] if options.until_idle else []
    given += ["--until-settled"] if options.until_settled else []
    given += ["--json"] if options.json else []
    given += [f"--parallelization={options.parallelization}"] if options.parallelization else []
    given += [f"--rules={rules}"] if rules else []
    children = {
        region: subprocess.Popen(
            [sys.executable, "-m", "tally.cli", "pump", "--region", region, *given],
            stderr=subprocess.PIPE,
            # Its own session: a terminal's Ctrl-C reaches this process alone, which passes it
            # on once (a second one abandons the invocations in flight, as with one pump).
            start_new_session=True,
        )
        for region in stack.regions
    }
    console.note(f"pump: serving {', '.join(stack.regions)}, a pump each")
    relays = [
        threading.Thread(target=_relay, args=(child.stderr, region), daemon=True)
        for region, child in children.items()
    ]
    for relay in relays:
        relay.start()
    codes: dict[str, int] = {}
    with _passed_on(children) as stopping:
        try:
            while len(codes) < len(children):
                for region, child in children.items():
                    code = child.poll()
                    if code is None or region in codes:
                        continue
                    # Killed by a signal before it could stop itself: the shell's 128 + N.
                    codes[region] = code = 128 - code if code < 0 else code
                    forever = not (options.until_idle or options.until_settled)
                    if code and forever and not stopping:
                        console.note(f"pump: {region} ended with {code}; stopping the others")
                        stopping.append(signal.SIGTERM)
                        _signal(children, signal.SIGTERM)
                time.sleep(0.1)
        finally:
            for child in children.values():
                if child.poll() is None:  # this process is leaving on an error of its own
                    child.kill()
                    child.wait()
    for relay in relays:
        relay.join(timeout=5)
    return max(codes.values())


def _relay(stream: IO[bytes] | None, region: str) -> None:
    """A child's messages on this process's stderr, each line prefixed with its Region."""
    if stream is None:
        return
    for line in stream:
        console.note(f"{region}: {line.decode(errors='replace').rstrip()}")


def _signal(children: dict[str, subprocess.Popen[bytes]], number: int) -> None:
    for child in children.values():
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(number)


@contextlib.contextmanager
def _passed_on(children: dict[str, subprocess.Popen[bytes]]) -> Iterator[list[int]]:
    """SIGINT and SIGTERM passed on to every child; yields the signals received."""
    received: list[int] = []

    def pass_on(number: int, _: object) -> None:
        received.append(number)
        _signal(children, number)

    previous = {n: signal.signal(n, pass_on) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
