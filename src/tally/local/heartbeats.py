"""The HeartbeatFunction's schedule, played locally: for as long as a multi-Region stack runs
(in its emulator's process, started by `tally local up --regions` and stopped by `tally local
down`), each Region's heartbeat is put through that Region's own front every
``HEARTBEAT_SECONDS`` of the stack, by the code the function runs, stamped by the Region's
clock (skewed as `--skew-ms` says). A Region taken offline keeps beating, its beats held for
the others, as a Region cut off in AWS keeps its schedule."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import boto3

from tally.reconciler.table.heartbeats import Heartbeats, beat_time


@dataclass(frozen=True)
class Schedule:
    """What beats: every ``seconds``, the table's heartbeat items under these key names."""

    seconds: float
    table: str
    partition_key: str
    sort_key: str | None
    skew_ms: Mapping[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "table": self.table,
            "partition_key": self.partition_key,
            "sort_key": self.sort_key,
        }

    @classmethod
    def of(cls, given: Mapping[str, Any], skew_ms: Mapping[str, float]) -> Schedule:
        return cls(
            float(given["seconds"]),
            str(given["table"]),
            str(given["partition_key"]),
            given.get("sort_key"),
            dict(skew_ms),
        )


class Beats:
    """A thread that beats every Region until stopped; a Region that does not answer (or a
    table not made yet) misses that beat, as a failed scheduled invocation would."""

    def __init__(self, schedule: Schedule, endpoints: Mapping[str, str]):
        self.schedule = schedule
        self._hearts = {
            region: Heartbeats(
                boto3.client(
                    "dynamodb",
                    endpoint_url=endpoint,
                    region_name=region,
                    aws_access_key_id="local",
                    aws_secret_access_key="local",
                ),
                schedule.table,
                schedule.partition_key,
                schedule.sort_key,
            )
            for region, endpoint in endpoints.items()
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)

    def __enter__(self) -> Beats:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            for region, hearts in self._hearts.items():
                skew = int(self.schedule.skew_ms.get(region, 0))
                # A Region not answering, a table not made yet: that beat is missed.
                with contextlib.suppress(Exception):
                    hearts.beat(region, beat_time(skew))
            if self._stop.wait(self.schedule.seconds):
                return
