"""``python -m tally.local.replication SETTINGS.json``: the multi-Region emulator as a process
(what `tally local up --regions` starts), serving until it is sent SIGTERM or SIGINT."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from pathlib import Path

from tally.local.heartbeats import Beats, Schedule
from tally.local.replication.emulator import Emulator, EmulatorError, Settings
from tally.local.replication.replicator import Lag


def settings_from(path: Path) -> Settings:
    given = json.loads(path.read_text())
    lag = given.get("lag")
    link_lags = {}
    for link, value in given.get("link_lags", {}).items():
        source, arrow, destination = link.partition("->")
        if not arrow:
            raise ValueError(f"link_lags: {link!r} is not 'source -> destination'")
        lag = Lag(float(value["median_ms"]), value.get("p99_ms"))
        link_lags[(source.strip(), destination.strip())] = lag
    return Settings(
        regions=given["regions"],
        tables=given["tables"],
        consistency=given.get("consistency", "eventual"),
        lag=None if lag is None else Lag(float(lag["median_ms"]), lag.get("p99_ms")),
        link_lags=link_lags,
        skew_ms=given.get("skew_ms", {}),
        seed=int(given.get("seed", 0)),
        conflict_window_ms=float(given.get("conflict_window_ms", 50)),
        ports={r: int(p) for r, p in given.get("ports", {}).items()},
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tally.local.replication SETTINGS.json", file=sys.stderr)
        return 2
    try:
        emulator = Emulator(settings_from(Path(argv[0])))
    except (OSError, ValueError, KeyError, EmulatorError) as exc:
        print(f"tally.local.replication: {exc}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    given = json.loads(Path(argv[0]).read_text()).get("heartbeat")
    with contextlib.ExitStack() as running:
        running.enter_context(emulator)
        if given:  # the stack's HeartbeatFunction schedule, played while it runs
            schedule = Schedule.of(given, emulator.settings.skew_ms)
            running.enter_context(Beats(schedule, emulator.endpoints()))
        print(json.dumps(emulator.endpoints()), flush=True)
        stopping.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
