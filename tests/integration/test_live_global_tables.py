"""Live: the project's writers in every Region of an emulated Global Table (two and three
Regions, replication lagging, one Region offline for a while), every Region's reconciler on
its own stream, and what they alert against what happened (tests/harness/live_regions.py):
every child lost to last-writer-wins alerted once, by the Region that lost it; every post
left off its children alerted once and repaired by the home Region, so that once settled
every post equals its children in every Region; no other Region repairs anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tally.local.stack_record import load
from tests.harness.live_regions import items, judge, write
from tests.integration.test_cli import clean_env, tally
from tests.integration.test_local_regions import emulator

pytestmark = pytest.mark.serial


@pytest.mark.parametrize("regions", ["us-east-1,eu-west-1", "us-east-1,eu-west-1,ap-southeast-2"])
def test_every_loss_is_alerted_once_by_the_region_that_can_prove_it(
    regions: str, tmp_path: Path
) -> None:
    env = clean_env(tmp_path)
    tally("local", "up", "--regions", regions, "--lag-ms", "300", env=env)
    try:
        stack = load(Path(env["TALLY_STATE_DIR"]))
        assert stack is not None
        stacks = [stack.in_region(r) for r in stack.regions]
        last = stacks[-1].region

        def offline(cut: bool) -> None:
            emulator(stack, "offline" if cut else "online", {"region": last})

        written = write(stacks, seconds=9, threads=2, seed=len(stacks), offline=offline)
        emulator(stack, "settle", {"timeout": 120})
        before = items(stacks[0])  # what happened, before any reconciler ran
        pumped = tally("pump", "--until-settled", "--json", env=env)
        assert all(json.loads(line)["idle"] for line in pumped.stdout.splitlines())
        alerts = [json.loads(a) for a in tally("alerts", "--json", env=env).stdout.splitlines()]
        settle = lambda: emulator(stack, "settle", {"timeout": 120})  # noqa: E731
        judged = judge(stacks, written, before, alerts, settle)
        counts = judged.counts()
        print(f"\n{len(stacks)} Regions: {counts}; other alerts {dict(judged.other_alerts)}")
        assert counts["children lost"] > 0
        assert counts["false negatives (children)"] == 0
        assert counts["false positives (children)"] == 0
        assert counts["alerted twice (children)"] == 0
        assert counts["false negatives (drift)"] == 0
        assert counts["false positives (drift)"] == 0
        assert counts["alerted twice or not from home (drift)"] == 0
        assert counts["false negatives (counter behind)"] == 0
        assert counts["counter behind alerted outside home"] == 0
        assert counts["repairs applied outside the home Region"] == 0
        assert counts["posts still off after settle, any Region"] == 0
        assert counts["posts repaired (items carrying the repair marker)"] == counts["posts off"]
    finally:
        tally("local", "down", env=env)
