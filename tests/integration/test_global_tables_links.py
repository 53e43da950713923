"""A replication link that stalls (docs/global-tables.md, "Heartbeats"): while the other
Region's writes are held on their way, the home Region does not act on an imbalance they may
explain; it alerts the stalled link once, and judges once the link is live again.

Driven as a user drives it: `tally local up --regions`, the project's writer in the second
Region, an outsider's write in the home Region, `tally pump` (each Region's real handler in
a process of its own; the heartbeats' schedule played by the stack's emulator process),
`tally alerts`. The stall
is made certain, not timed: the second Region is cut off (it keeps taking its own writes, held
for the others) for longer than the settle window and a heartbeat."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tally.local.stack_record import load
from tally.rules import DEFAULT_RULES_FILE, load_rules
from tally.writers import TallyWriter
from tests.harness.live_regions import items, regional_client
from tests.integration.test_cli import clean_env, tally
from tests.integration.test_local_regions import emulator

pytestmark = pytest.mark.serial

US, EU = "us-east-1", "eu-west-1"
POST = "POST#stalled"


def _alerts(env: dict[str, str]) -> list[dict[str, Any]]:
    return [json.loads(a) for a in tally("alerts", "--json", env=env).stdout.splitlines()]


def _likes(held: dict[tuple[str, str], dict[str, Any]]) -> tuple[int, Any]:
    children = sum(1 for pk, sk in held if pk == POST and sk.startswith("LIKE#"))
    return children, held[(POST, "META")]["likeTally"]


def test_a_stalled_link_holds_the_home_regions_repair_until_its_writes_arrive(
    tmp_path: Path,
) -> None:
    env = clean_env(tmp_path)
    # Lag 200 ms: a settle window of 5 s, a heartbeat every second.
    tally("local", "up", "--regions", f"{US},{EU}", "--lag-ms", "200", env=env)
    try:
        stack = load(Path(env["TALLY_STATE_DIR"]))
        assert stack is not None and stack.replication is not None
        settle = stack.replication.settle_seconds()
        us, eu = (stack.in_region(r) for r in (US, EU))
        rules = load_rules(DEFAULT_RULES_FILE)
        regional_client(us).put_item(
            TableName=us.table_name,
            Item={"PK": {"S": POST}, "SK": {"S": "META"}, "likeTally": {"N": "0"}},
        )
        emulator(stack, "settle", {"timeout": 60})

        emulator(stack, "offline", {"region": EU})
        eu_writer = TallyWriter(regional_client(eu), eu.table_name, rules, region=EU)
        for n in range(3):
            assert eu_writer.add_child({"PK": POST, "SK": f"LIKE#USER#{n}"}).outcome == "created"
        # An outsider in the home Region sets the counter to 5 (later: it wins everywhere).
        regional_client(us).update_item(
            TableName=us.table_name,
            Key={"PK": {"S": POST}, "SK": {"S": "META"}},
            UpdateExpression="SET likeTally = :five",
            ExpressionAttributeValues={":five": {"N": "5"}},
        )
        # The home Region holds 5 and no child; the three children are held in eu-west-1.
        assert _likes(items(us)) == (0, 5)
        # Pumped while the link is cut, for several settle windows: not idle (the home
        # Region's look waits), exit 1.
        tally("pump", "--until-settled", f"--max-seconds={4 * settle}", env=env, expect=1)
        assert _likes(items(us)) == (0, 5)  # not "repaired" to 0: three children are coming
        stalled = [a for a in _alerts(env) if a["kind"] == "replication_stalled"]
        assert [(a["region"], a["key"]["source"], a["severity"]) for a in stalled] == [
            (US, EU, "warning")
        ], stalled
        assert not [a for a in _alerts(env) if a["kind"] == "drift"]

        emulator(stack, "online", {"region": EU})
        emulator(stack, "settle", {"timeout": 60})
        assert _likes(items(us)) == (3, 5)  # the outsider's later write won everywhere
        tally("pump", "--until-settled", env=env)
        emulator(stack, "settle", {"timeout": 60})
        assert {s.region: _likes(items(s)) for s in (us, eu)} == {US: (3, 3), EU: (3, 3)}
        alerts = _alerts(env)
        drift = [a for a in alerts if a["kind"] == "drift"]
        assert [(a["region"], a["repair"]["status"]) for a in drift] == [(US, "applied")], drift
        assert (drift[0]["stored"], drift[0]["actual"]) == (5, 3)
        # The stall was alerted once, however many looks it held.
        assert len([a for a in alerts if a["kind"] == "replication_stalled"]) == 1
    finally:
        tally("local", "down", env=env)
