"""The local stack behind `tally local up/down`: DynamoDB Local and moto's server (SNS, SQS)
as background processes that outlive the command, holding template.yaml's resources.

`up` checks the counted table against the rules, starts both processes, waits until they
answer and records what it started in ``<state dir>/local.json``; `down` stops exactly that.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tally.local import processes
from tally.local.dynamodb_local import JAR_NAME, DynamoDBLocalUnavailable, tail
from tally.local.dynamodb_local import command as dynamodb_command
from tally.local.functions import bundled_rules
from tally.local.stack_record import (
    REGION,
    LocalStack,
    LocalStackError,
    Replication,
    load,
    local_client,
    sam_env,
)
from tally.local.stack_resources import PREFIX, CountedTable, counted_table, create_resources
from tally.local.state import (
    ALERTS_FILE,
    CHECKPOINT_FILE,
    DYNAMODB_LOG,
    FUNCTION_LOG,
    MOTO_LOG,
    REGIONS_DIR,
    REPLICATION_SETTINGS,
    SAM_ENV_FILE,
    STATE_FILE,
)
from tally.local.template import load_template, template_path

# Each process is recognised by an argument of its command line (and its port) before
# `down` signals it, so a pid reused by another program is never touched.
DYNAMODB_MARKER = JAR_NAME
MOTO_MARKER = "moto.server"
EMULATOR_MARKER = "tally.local.replication"

_PROBE = Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1})
# Whether a recorded stack still answers: its processes run (checked first), so only a slow
# answer is left to wait for, and a busy machine must not pass for a stopped stack.
_ALIVE = Config(connect_timeout=2, read_timeout=10, retries={"total_max_attempts": 2})


def up(
    state_dir: Path,
    *,
    prefix: str = PREFIX,
    dynamodb_port: int | None = None,
    moto_port: int | None = None,
    startup_timeout: float = 60.0,
    rules_file: Path | None = None,
    template: Path | None = None,
    table_id: str = "Table",
    starting: Callable[[], None] = lambda: None,
) -> LocalStack:
    """Start the stack and create the template's resources, or return the running one;
    ``starting`` is called once everything is checked, before processes start.

    Ports default to free ones. A stack recorded in ``state_dir`` whose processes still
    answer is returned as is (``already_running``) if it holds the same table and rules;
    one whose processes are gone is replaced. With DYNAMODB_ENDPOINT set, that DynamoDB is
    used and no DynamoDB Local is started.
    """
    rules_file, table = counted(rules_file, template, table_id)
    existing = reuse(state_dir, rules_file, table)
    if existing is not None:
        return existing
    need_moto()
    # Only DYNAMODB_ENDPOINT: AWS_ENDPOINT_URL_DYNAMODB may be a stale `tally local env` export.
    external = os.environ.get("DYNAMODB_ENDPOINT")
    if external and dynamodb_port is not None:
        raise LocalStackError(f"DYNAMODB_ENDPOINT={external} is set; no DynamoDB port to choose")
    starting()
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / FUNCTION_LOG).unlink(missing_ok=True)  # a new stack's log: its own lines only
    with contextlib.ExitStack() as held:
        moto_port = _reserve_port(held, "127.0.0.1", moto_port, "moto server")
        dynamodb: tuple[list[str], Path] | None = None
        if not external:
            # DynamoDB Local cannot bind loopback only, so the port must be free everywhere.
            dynamodb_port = _reserve_port(held, "", dynamodb_port, "DynamoDB Local")
            try:
                # Before anything starts, so a missing Java or npm leaves nothing behind.
                dynamodb = dynamodb_command(dynamodb_port)
            except DynamoDBLocalUnavailable as exc:
                raise LocalStackError(str(exc)) from exc

    started: list[int] = []
    try:
        moto_endpoint = f"http://127.0.0.1:{moto_port}"
        moto = _moto(state_dir, moto_port)
        started.append(moto.pid)
        dynamodb_process = None
        if dynamodb is not None:
            command, cwd = dynamodb
            dynamodb_process = _spawn(command, cwd=cwd, log=state_dir / DYNAMODB_LOG)
            started.append(dynamodb_process.pid)
        dynamodb_endpoint = external or f"http://127.0.0.1:{dynamodb_port}"

        # Both start at once (moto ~1 s, the JVM ~3 s, more on a busy machine); wait for each.
        deadline = time.monotonic() + startup_timeout
        sqs = local_client("sqs", moto_endpoint, _PROBE)
        _wait_ready("moto server", moto, state_dir / MOTO_LOG, sqs.list_queues, deadline)
        list_tables = partial(
            local_client("dynamodb", dynamodb_endpoint, _PROBE).list_tables, Limit=1
        )
        if dynamodb_process is not None:
            log = state_dir / DYNAMODB_LOG
            _wait_ready("DynamoDB Local", dynamodb_process, log, list_tables, deadline)
        elif not _probe(list_tables):
            raise LocalStackError(f"DYNAMODB_ENDPOINT={external} does not answer")

        _forget(state_dir)
        stack = create_resources(
            state_dir,
            prefix,
            table,
            dynamodb_endpoint=dynamodb_endpoint,
            dynamodb_pid=None if dynamodb_process is None else dynamodb_process.pid,
            dynamodb_port=dynamodb_port,
            moto_endpoint=moto_endpoint,
            moto_pid=moto.pid,
            moto_port=moto_port,
        )
        stack = replace(stack, rules_file=str(rules_file) if rules_file else None)
        stack.save()
        (state_dir / SAM_ENV_FILE).write_text(json.dumps(sam_env(stack), indent=2) + "\n")
    except BaseException:
        _stop(started, timeout=10.0)
        raise
    return stack


def counted(
    rules_file: Path | None, template: Path | None, table_id: str
) -> tuple[Path | None, CountedTable]:
    """The rules file the stack's functions load (None: the bundled one) and its counted
    table, checked against them."""
    bundled = bundled_rules(load_template(template_path()))
    # The bundled rules named explicitly (`tally local env` exports them) are no rules of yours.
    rules_file = rules_file.resolve() if rules_file and rules_file.resolve() != bundled else None
    return rules_file, counted_table(rules_file, template.resolve() if template else None, table_id)


def reuse(
    state_dir: Path,
    rules_file: Path | None,
    table: CountedTable,
    replication: Replication | None = None,
    regions: Sequence[str] = (REGION,),
) -> LocalStack | None:
    """The stack recorded in ``state_dir``, ``already_running``, when its processes answer and
    it holds this table and these rules, Regions and replication (LocalStackError when it
    holds others); None when there is none, or none left (its survivors are stopped)."""
    existing = load(state_dir)
    if existing is None:
        return None
    if not answers(existing):
        down(state_dir)  # stops whichever of its processes survived
        return None
    wanted = (str(rules_file) if rules_file else None, table.source)
    if (existing.rules_file, existing.table_source) != wanted:
        raise LocalStackError(
            f"the local stack runs table {existing.table_source} with rules "
            f"{existing.rules_file or 'bundled'}; `tally local down` first"
        )
    if (existing.regions, _profile(existing.replication)) != (
        list(regions),
        _profile(replication),
    ):
        raise LocalStackError(
            f"the local stack runs {_shape(existing.regions, existing.replication)}, not "
            f"{_shape(regions, replication)}; `tally local down` first"
        )
    return replace(existing, already_running=True)


def _profile(replication: Replication | None) -> tuple[object, ...]:
    if replication is None:
        return ()
    return (replication.consistency, replication.lag_median_ms, replication.lag_p99_ms)


def _shape(regions: Sequence[str], replication: Replication | None) -> str:
    if replication is None:
        return f"one Region ({', '.join(regions)})"
    return f"Regions {', '.join(regions)} ({replication.describe()})"


def need_moto() -> None:
    if importlib.util.find_spec("moto") is None:
        raise LocalStackError(
            "local mode runs SNS and SQS on moto's server, which is not installed: "
            "pip install 'tally-reconciler[local]'"
        )


def down(state_dir: Path, timeout: float = 10.0) -> list[str]:
    """Stop the processes `up` recorded and remove the state file; returns what it stopped.

    A recorded pid that no longer runs the program `up` started is left alone.
    """
    stack = load(state_dir)
    if stack is None:
        return []
    ours = {
        pid: name
        for name, pid, marker, argument in _recorded(stack)
        if processes.runs(pid, marker, argument)
    }
    _stop(list(ours), timeout)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    _forget(state_dir)
    return list(ours.values())


def _forget(state_dir: Path) -> None:
    """Remove what belonged to a stopped stack: its alerts never show in the next one."""
    for directory in (state_dir, *sorted((state_dir / REGIONS_DIR).glob("*"))):
        for name in (ALERTS_FILE, CHECKPOINT_FILE, SAM_ENV_FILE):
            (directory / name).unlink(missing_ok=True)
    (state_dir / REPLICATION_SETTINGS).unlink(missing_ok=True)


def _recorded(stack: LocalStack) -> list[tuple[str, int, str, str]]:
    """(what it is, pid, command-line marker, port or settings file) of each process the
    stack started: moto's server, the replication emulator, each DynamoDB Local."""
    recorded = [
        (
            f"moto server (pid {stack.moto_pid}, port {stack.moto_port})",
            stack.moto_pid,
            MOTO_MARKER,
            str(stack.moto_port),
        )
    ]
    replication = stack.replication
    if replication is not None:
        recorded.append(
            (
                f"replication emulator (pid {replication.pid}, {replication.settings})",
                replication.pid,
                EMULATOR_MARKER,
                replication.settings,
            )
        )
    databases: dict[tuple[int, int], list[str]] = {}
    for regional in (stack, *stack.replicas):
        if regional.dynamodb_pid is not None and regional.dynamodb_port is not None:
            databases.setdefault((regional.dynamodb_pid, regional.dynamodb_port), []).append(
                regional.region
            )
    for (pid, port), regions in databases.items():
        name = (
            "DynamoDB Local" if replication is None else f"DynamoDB Local of {', '.join(regions)}"
        )
        recorded.append((f"{name} (pid {pid}, port {port})", pid, DYNAMODB_MARKER, str(port)))
    return recorded


def answers(stack: LocalStack) -> bool:
    """Whether the recorded processes are still ours and every endpoint answers."""
    if not all(processes.runs(pid, m, argument) for _, pid, m, argument in _recorded(stack)):
        return False
    sqs = local_client("sqs", stack.moto_endpoint, _ALIVE)
    if not _probe(sqs.list_queues):
        return False
    for regional in (stack, *stack.replicas):
        ddb = local_client("dynamodb", regional.dynamodb_endpoint, _ALIVE, regional.region)
        if not _probe(partial(ddb.list_tables, Limit=1)):
            return False
    return True


def _probe(call: Callable[[], object]) -> bool:
    try:
        call()
    except (BotoCoreError, ClientError):
        return False
    return True


def _reserve_port(held: contextlib.ExitStack, host: str, port: int | None, what: str) -> int:
    """Bind ``port`` (or a free one) and hold it until ``held`` closes; returns the port.

    Holding every port until all are chosen keeps two services from drawing the same one.
    """
    sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    try:
        sock.bind((host, port or 0))
    except OSError as exc:
        raise LocalStackError(
            f"port {port} for {what} is already in use ({exc.strerror}); "
            "choose another or stop what holds it"
        ) from exc
    chosen: int = sock.getsockname()[1]
    return chosen


def _moto(state_dir: Path, port: int) -> subprocess.Popen[bytes]:
    return _spawn(
        [sys.executable, "-m", MOTO_MARKER, "-H", "127.0.0.1", "-p", str(port)],
        cwd=state_dir,
        log=state_dir / MOTO_LOG,
    )


def _spawn(command: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        # A session of its own: Ctrl-C or closing the terminal that ran `up` leaves it running.
        return subprocess.Popen(
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(
    name: str,
    process: subprocess.Popen[bytes],
    log: Path,
    probe: Callable[[], object],
    deadline: float,
) -> None:
    while True:
        if process.poll() is not None:
            raise LocalStackError(
                f"{name} exited with {process.returncode}; log {log}:\n{tail(log)}"
            )
        try:
            probe()
            return
        except BotoCoreError:
            if time.monotonic() > deadline:
                raise LocalStackError(
                    f"{name} did not answer in time; log {log}:\n{tail(log)}"
                ) from None
            time.sleep(0.1)


def _stop(pids: list[int], timeout: float) -> None:
    survivors = processes.stop(pids, timeout)
    if survivors:
        raise LocalStackError(f"processes {survivors} did not exit after SIGKILL")
