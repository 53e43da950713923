"""A parent written from two Regions whose increments keep losing to last writer wins: the
home Region repairs it, and repairs it again, then escalates it as ``contended`` instead of
repairing it a fourth time; every alert from the home Region, none from the other.

Driven as a user drives it: `tally local up --regions`, the project's writers in each Region,
`tally pump` (each Region's real handler in a process of its own), `tally alerts`. The race
is made certain, not timed: the second Region is cut off while both write, then brought back,
so its later write wins everywhere and the first Region's increment is lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tally.local.stack_record import load
from tally.rules import DEFAULT_RULES_FILE, load_rules
from tally.writers import TallyWriter
from tests.harness.live_regions import items, regional_client
from tests.integration.test_cli import clean_env, tally
from tests.integration.test_local_regions import emulator

pytestmark = pytest.mark.serial

US, EU = "us-east-1", "eu-west-1"
POST = "POST#contended"


def test_a_parent_that_keeps_losing_increments_is_escalated_after_three_repairs(
    tmp_path: Path,
) -> None:
    env = clean_env(tmp_path)
    tally("local", "up", "--regions", f"{US},{EU}", "--lag-ms", "0", env=env)
    try:
        stack = load(Path(env["TALLY_STATE_DIR"]))
        assert stack is not None
        us, eu = (stack.in_region(r) for r in (US, EU))
        rules = load_rules(DEFAULT_RULES_FILE)
        writers = {
            s.region: TallyWriter(regional_client(s), s.table_name, rules, region=s.region)
            for s in (us, eu)
        }
        regional_client(us).put_item(
            TableName=us.table_name,
            Item={"PK": {"S": POST}, "SK": {"S": "META"}, "likeTally": {"N": "0"}},
        )
        emulator(stack, "settle", {"timeout": 60})
        seen: list[dict[str, object]] = []
        for round in range(4):
            emulator(stack, "offline", {"region": EU})
            for n, region in enumerate((US, EU)):
                like = {"PK": POST, "SK": f"LIKE#USER#{2 * round + n}"}
                assert writers[region].add_child(like).outcome == "created"
            emulator(stack, "online", {"region": EU})
            emulator(stack, "settle", {"timeout": 60})
            held = items(us)
            children = sum(1 for pk, sk in held if pk == POST and sk.startswith("LIKE#"))
            assert (children, held[(POST, "META")]["likeTally"]) == (2 * round + 2, 2 * round + 1)
            tally("pump", "--until-settled", env=env)
            alerts = [json.loads(a) for a in tally("alerts", "--json", env=env).stdout.splitlines()]
            new = [a for a in alerts if a not in seen]
            seen += new
            assert [(a["kind"], a["region"], a["key"]["PK"]) for a in new] == [
                ("drift" if round < 3 else "contended", US, POST)
            ], new
            [alert] = new
            status = alert["repair"]["status"]
            emulator(stack, "settle", {"timeout": 60})
            counter = {s.region: items(s)[(POST, "META")]["likeTally"] for s in (us, eu)}
            if round < 3:
                assert status == "applied"
                assert counter == {US: 2 * round + 2, EU: 2 * round + 2}  # repaired, replicated
            else:
                assert (
                    status == "skipped"
                    and "route this parent's writes" in alert["repair"]["reason"]
                )
                assert counter == {US: 7, EU: 7}  # left as it stands: 8 children
                assert "holds writes from eu-west-1" in alert["detail"]  # us's always lost
    finally:
        tally("local", "down", env=env)
