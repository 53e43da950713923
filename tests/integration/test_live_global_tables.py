"""Live: the project's writers in every Region of an emulated Global Table (two and three
Regions; replication lag drawn per change, so changes reorder and merge; the last Region's
clock skewed; one Region offline for a while; responses lost after commit and throttling on
the writers' clients), every Region's reconciler on its own stream, and what they alert
against what happened (tests/harness/live_regions.py).

Judged once settled: each pump runs after the writers stopped and replication settled, so
the table before any reconciler ran is the ground truth: every child lost to last-writer-wins
alerted once, by the Region that lost it; every post or order left off its children alerted
once, from the home Region, posts repaired there so that once settled every post equals its
children in every Region; no other Region repairs anything.

Live: the pumps run while the writers write and replication is in flight (the reconciler
judging what has not arrived yet); the same for children lost, and for posts the end state:
every post equal to its children in every Region, no alert and no repair outside the home
Region. Each prints the alert latency per kind against the emulated lag."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tally.local.stack_record import load
from tests.harness.live_regions import items, judge, write
from tests.integration.test_cli import clean_env, tally
from tests.integration.test_local_regions import emulator

pytestmark = pytest.mark.serial


@pytest.mark.parametrize("live", [False, True], ids=["judged-once-settled", "pumps-live"])
@pytest.mark.parametrize("regions", ["us-east-1,eu-west-1", "us-east-1,eu-west-1,ap-southeast-2"])
def test_every_loss_is_alerted_once_by_the_region_that_can_prove_it(
    regions: str, live: bool, tmp_path: Path
) -> None:
    env = clean_env(tmp_path)
    last = regions.split(",")[-1]
    # The default lag: drawn per change, median 300 ms, p99 2 s (settle window 20 s).
    tally("local", "up", "--regions", regions, "--skew-ms", f"{last}=-150", env=env)
    pumps = None
    try:
        stack = load(Path(env["TALLY_STATE_DIR"]))
        assert stack is not None and stack.replication is not None
        stacks = [stack.in_region(r) for r in stack.regions]

        def offline(cut: bool) -> None:
            emulator(stack, "offline" if cut else "online", {"region": last})

        if live:
            pumps = subprocess.Popen(
                [sys.executable, "-m", "tally.cli", "pump"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        written = write(stacks, seconds=9, threads=2, seed=len(stacks), offline=offline)
        emulator(stack, "settle", {"timeout": 120})
        before = items(stacks[0])  # what the writers left (and, live, what was repaired)
        if pumps is not None:
            pumps.send_signal(signal.SIGTERM)
            pumps.wait(timeout=120)
        pumped = tally("pump", "--until-settled", "--json", env=env)
        assert all(json.loads(line)["idle"] for line in pumped.stdout.splitlines())
        alerts = [json.loads(a) for a in tally("alerts", "--json", env=env).stdout.splitlines()]
        settle = lambda: emulator(stack, "settle", {"timeout": 120})  # noqa: E731
        judged = judge(stacks, written, before, alerts, settle, live=live)
        counts = judged.counts()
        print(
            f"\n{len(stacks)} Regions ({'live' if live else 'judged once settled'}; "
            f"{stack.replication.describe()}; settle {stack.replication.settle_seconds()} s): "
            f"{counts}; faults injected {dict(written.faults)}; "
            f"latency {judged.latencies()}; other alerts {dict(judged.other_alerts)}; "
            f"acknowledged creations by writer {dict(written.kinds)}; "
            f"children lost by writer {dict(judged.lost_by_writer)}; missed {judged.missed()}"
        )
        assert counts["children lost"] > 0
        assert written.kinds["seed 004 likes"] > 0 and written.kinds["seed 003 numbers"] > 0
        assert written.faults["responses lost after commit"] > 0
        assert counts["false negatives (children)"] == 0
        assert counts["false positives (children)"] == 0
        assert counts["alerted twice (children)"] == 0
        assert counts["drift alerted outside home"] == 0
        assert counts["false negatives (counter behind)"] == 0
        assert counts["counter behind alerted outside home"] == 0
        assert counts["repairs applied outside the home Region"] == 0
        assert counts["posts still off after settle, any Region"] == 0
        assert counts["false positives (gaps: the member is there)"] == 0
        if not live:
            assert counts["false negatives (drift)"] == 0
            assert counts["false positives (drift)"] == 0
            assert counts["alerted twice (drift)"] == 0
            posts_repaired = counts["posts repaired (items carrying the repair marker)"]
            assert posts_repaired == counts["posts off"]
            assert counts["orders alerted, not repaired"] == counts["orders off"]
    finally:
        if pumps is not None and pumps.poll() is None:
            pumps.kill()
        tally("local", "down", env=env)
