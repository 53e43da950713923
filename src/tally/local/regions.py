"""A multi-Region local stack (`tally local up --regions`): a DynamoDB Local per Region (one
for all three in the strongly consistent profile), the replication emulator's front per Region
before them (``tally.local.replication``: the endpoint programs use), moto's server for every
Region's SNS, SQS and SSM, and each Region's resources made through its own front and clients.

The counted table is the replicated one, as a Global Table would be. The audit table stays
regional (a table of the same name in each Region, never replicated): each Region's reconciler
keeps its own findings, de-duplication and watermarks, as it would deployed per Region. In
the strongly consistent profile the Regions share one database, so both tables are made once;
the counted table has no TTL there (MRSC refuses it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, partial
from pathlib import Path
from typing import Literal

import boto3

from tally.local import stack as local_stack
from tally.local.dynamodb_local import DynamoDBLocalUnavailable, tail
from tally.local.dynamodb_local import command as dynamodb_command
from tally.local.heartbeats import Schedule
from tally.local.stack_record import (
    LocalStack,
    LocalStackError,
    Replication,
    local_client,
    region_dir,
    sam_env,
)
from tally.local.stack_resources import PREFIX, TABLE, create_resources
from tally.local.state import (
    DYNAMODB_LOG,
    FUNCTION_LOG,
    MOTO_LOG,
    REGIONS_DIR,
    REPLICATION_LOG,
    REPLICATION_SETTINGS,
    SAM_ENV_FILE,
)

Consistency = Literal["eventual", "strong"]

# Replication lag when none is asked for, drawn per change: AWS says a replica is usually
# current within a second and publishes no bound (its ReplicationLatency metric); a median of
# 300 ms with a 99th percentile of 2 s keeps most changes under a second and leaves a tail
# long enough for a race to show.
DEFAULT_LAG_MEDIAN_MS = 300
DEFAULT_LAG_P99_MS = 2000
MAX_LAG_MS = 3_600_000
# Three JVMs starting at once on a small machine take their time.
STARTUP_TIMEOUT = 120.0


@cache
def known_regions() -> frozenset[str]:
    """The Regions botocore knows DynamoDB in, in every partition."""
    session = boto3.session.Session()
    return frozenset(
        region
        for partition in session.get_available_partitions()
        for region in session.get_available_regions("dynamodb", partition_name=partition)
    )


def parse_regions(text: str) -> tuple[str, ...]:
    """``us-east-1,eu-west-1`` as Regions; ValueError saying what is wrong with it."""
    regions = tuple(part.strip() for part in text.split(","))
    unknown = [region for region in regions if region not in known_regions()]
    if unknown:
        shown = ", ".join(repr(region) for region in unknown)
        raise ValueError(f"{shown}: not an AWS Region DynamoDB runs in (e.g. us-east-1,eu-west-1)")
    twice = sorted({region for region in regions if regions.count(region) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} given twice")
    if len(regions) < 2:
        raise ValueError("two Regions or more (one Region is `tally local up` without --regions)")
    return regions


def parse_lag(text: str) -> int:
    """Milliseconds of replication lag, 0 to an hour; ValueError otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_LAG_MS:
        raise ValueError(f"milliseconds from 0 to {MAX_LAG_MS}, not {text!r}")
    return value


MAX_SKEW_MS = 60_000


def parse_skew(text: str) -> tuple[tuple[str, int], ...]:
    """``eu-west-1=250,ap-southeast-2=-100``: how far each Region's clock runs ahead (or behind,
    negative) in milliseconds, up to a minute; ValueError saying what is wrong with it."""
    skews: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        region, _, ms = part.partition("=")
        try:
            value = int(ms)
        except ValueError:
            raise ValueError(f"REGION=MS pairs, comma-separated, not {part!r}") from None
        if not -MAX_SKEW_MS <= value <= MAX_SKEW_MS:
            raise ValueError(f"{region}: milliseconds from -{MAX_SKEW_MS} to {MAX_SKEW_MS}")
        if region.strip() in skews:
            raise ValueError(f"{region.strip()} given twice")
        skews[region.strip()] = value
    return tuple(skews.items())


@dataclass(frozen=True)
class Layout:
    """What `up --regions` asks for: the Regions, the consistency, and a fixed lag (None: the
    default drawn lag). ValueError for a combination Global Tables do not offer."""

    regions: tuple[str, ...]
    consistency: Consistency = "eventual"
    lag_ms: int | None = None
    skew_ms: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if unknown := [r for r, _ in self.skew_ms if r not in self.regions]:
            raise ValueError(f"a skew for {', '.join(unknown)}, not one of the Regions")
        if self.consistency == "strong" and self.skew_ms:
            raise ValueError("a strongly consistent (MRSC) table has no last writer to skew")
        if self.consistency == "strong" and len(self.regions) != 3:
            raise ValueError(
                "a strongly consistent (MRSC) global table has exactly three Regions, "
                f"not {len(self.regions)}"
            )
        if self.consistency == "strong" and self.lag_ms is not None:
            raise ValueError("a strongly consistent (MRSC) table has no replication lag to set")

    @property
    def databases(self) -> tuple[str, ...]:
        """The Regions that get a DynamoDB Local: each, or the first for all (strong)."""
        return self.regions[:1] if self.consistency == "strong" else self.regions

    def replication(self, pid: int = 0, settings: str = "") -> Replication:
        regions = list(self.regions)
        if self.consistency == "strong":
            return Replication(pid, settings, "strong", regions=regions)
        if self.lag_ms is not None:
            median, p99 = self.lag_ms, None
        else:
            median, p99 = DEFAULT_LAG_MEDIAN_MS, DEFAULT_LAG_P99_MS
        return Replication(
            pid, settings, "eventual", median, p99, regions=regions, skew_ms=dict(self.skew_ms)
        )


def emulator_settings(
    layout: Layout,
    databases: dict[str, str],
    table: str,
    keys: tuple[str, str | None] = ("PK", "SK"),
) -> dict[str, object]:
    """The emulator's settings file (``python -m tally.local.replication SETTINGS``): and, on
    an eventually consistent table, the heartbeats' schedule its process plays (the table's
    key names ``keys``)."""
    replication = layout.replication()
    lag = None
    if replication.lag_median_ms is not None:
        lag = {"median_ms": replication.lag_median_ms, "p99_ms": replication.lag_p99_ms}
    return {
        # strong: every Region's front before the one database
        "regions": {r: databases.get(r, databases[layout.databases[0]]) for r in layout.regions},
        "tables": [table],
        "consistency": layout.consistency,
        "lag": lag,
        "skew_ms": dict(replication.skew_ms),
        "seed": 0,
        "conflict_window_ms": 50,
        "ports": {},  # free ones: the emulator prints them
        "heartbeat": (
            Schedule(replication.heartbeat_seconds(), table, *keys).as_json()
            if layout.consistency == "eventual"
            else None
        ),
    }


def up(
    state_dir: Path,
    layout: Layout,
    *,
    prefix: str = PREFIX,
    startup_timeout: float = STARTUP_TIMEOUT,
    rules_file: Path | None = None,
    template: Path | None = None,
    table_id: str = "Table",
    starting: Callable[[], None] = lambda: None,
) -> LocalStack:
    """Start the multi-Region stack and make every Region's resources, or return the running
    one (``already_running``) if it is the same; the first Region's record holds the others'.
    """
    rules_file, table = local_stack.counted(rules_file, template, table_id)
    wanted = layout.replication()
    existing = local_stack.reuse(state_dir, rules_file, table, wanted, layout.regions)
    if existing is not None:
        return existing
    local_stack.need_moto()
    if external := os.environ.get("DYNAMODB_ENDPOINT"):
        raise LocalStackError(
            f"DYNAMODB_ENDPOINT={external} is set: a multi-Region stack starts a DynamoDB Local "
            "per Region of its own; unset it"
        )
    starting()
    state_dir = state_dir.absolute()
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / FUNCTION_LOG).unlink(missing_ok=True)
    local_stack._forget(state_dir)
    shutil.rmtree(state_dir / REGIONS_DIR, ignore_errors=True)  # the last stack's Regions
    for region in layout.regions[1:]:
        region_dir(state_dir, region).mkdir(parents=True)
    with contextlib.ExitStack() as held:
        moto_port = local_stack._reserve_port(held, "127.0.0.1", None, "moto server")
        ports = {
            r: local_stack._reserve_port(held, "", None, f"DynamoDB Local of {r}")
            for r in layout.databases
        }
        try:
            commands = {r: dynamodb_command(port) for r, port in ports.items()}
        except DynamoDBLocalUnavailable as exc:
            raise LocalStackError(str(exc)) from exc

    started: list[int] = []
    try:
        moto_endpoint = f"http://127.0.0.1:{moto_port}"
        moto = local_stack._moto(state_dir, moto_port)
        started.append(moto.pid)
        databases: dict[str, subprocess.Popen[bytes]] = {}
        for region, (command, cwd) in commands.items():
            databases[region] = local_stack._spawn(
                command, cwd=cwd, log=_log(state_dir, layout, region)
            )
            started.append(databases[region].pid)
        deadline = time.monotonic() + startup_timeout
        sqs = local_client("sqs", moto_endpoint, local_stack._PROBE)
        local_stack._wait_ready(
            "moto server", moto, state_dir / MOTO_LOG, sqs.list_queues, deadline
        )
        urls = {r: f"http://127.0.0.1:{port}" for r, port in ports.items()}
        for region, process in databases.items():
            probe = local_client("dynamodb", urls[region], local_stack._PROBE)
            local_stack._wait_ready(
                f"DynamoDB Local of {region}",
                process,
                _log(state_dir, layout, region),
                partial(probe.list_tables, Limit=1),
                deadline,
            )

        # The emulator once every database answers: its replicator reads them from the start.
        settings = state_dir / REPLICATION_SETTINGS
        counted_name = f"{prefix}-{TABLE}"
        schema = {k["KeyType"]: k["AttributeName"] for k in table.kwargs["KeySchema"]}
        keys = (schema["HASH"], schema.get("RANGE"))
        settings.write_text(
            json.dumps(emulator_settings(layout, urls, counted_name, keys), indent=2)
        )
        emulator = local_stack._spawn(
            [sys.executable, "-m", local_stack.EMULATOR_MARKER, str(settings)],
            cwd=state_dir,
            log=state_dir / REPLICATION_LOG,
        )
        started.append(emulator.pid)
        fronts = _fronts(emulator, state_dir / REPLICATION_LOG, layout.regions, deadline)

        replication = layout.replication(emulator.pid, str(settings))
        shared = layout.databases[0]
        if layout.consistency == "strong":
            table = replace(table, ttl_attribute=None)  # MRSC has no TTL
        records = []
        for region in layout.regions:
            database = region if region in databases else shared
            record = create_resources(
                state_dir if region == layout.regions[0] else region_dir(state_dir, region),
                prefix,
                table,
                dynamodb_endpoint=fronts[region],
                dynamodb_pid=databases[database].pid,
                dynamodb_port=ports[database],
                moto_endpoint=moto_endpoint,
                moto_pid=moto.pid,
                moto_port=moto_port,
                region=region,
            )
            records.append(
                replace(
                    record,
                    rules_file=str(rules_file) if rules_file else None,
                    replication=replication,
                )
            )
        stack = replace(records[0], replicas=tuple(records[1:]))
        stack.save()
        (state_dir / SAM_ENV_FILE).write_text(json.dumps(sam_env(stack), indent=2) + "\n")
    except BaseException:
        local_stack._stop(started, timeout=10.0)
        raise
    return stack


def _log(state_dir: Path, layout: Layout, region: str) -> Path:
    """A DynamoDB Local's log: the first Region's where a single-Region stack keeps it."""
    if region == layout.regions[0]:
        return state_dir / DYNAMODB_LOG
    return region_dir(state_dir, region) / DYNAMODB_LOG


def _fronts(
    emulator: subprocess.Popen[bytes], log: Path, regions: tuple[str, ...], deadline: float
) -> dict[str, str]:
    """Each Region's endpoint, from the line the emulator prints once its fronts listen."""
    while True:
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            try:
                shown = json.loads(line)
            except ValueError:
                continue
            if isinstance(shown, dict) and set(shown) == set(regions):
                return {region: str(shown[region]) for region in regions}
        if emulator.poll() is not None:
            raise LocalStackError(
                f"the replication emulator exited with {emulator.returncode}; "
                f"log {log}:\n{tail(log)}"
            )
        if time.monotonic() > deadline:
            raise LocalStackError(f"the replication emulator did not start in time; log {log}")
        time.sleep(0.1)
