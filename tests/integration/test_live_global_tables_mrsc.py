"""Live on the strongly consistent (MRSC) profile: the project's MRSC writers in three
Regions, likes and issue numbers racing, writers crashing between a like and its count
(tests/harness/live_mrsc.py); then every Region's pump. Each crash's post is found by the
home Region once and repaired there with no transaction on the table (which MRSC refuses),
no other Region alerts or writes, every post ends equal to its children, and no number is
handed out twice."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tally.local.stack_record import load
from tests.harness.live_mrsc import write
from tests.harness.live_regions import items
from tests.integration.test_cli import clean_env, tally

pytestmark = pytest.mark.serial

REGIONS = "us-east-1,eu-west-1,ap-southeast-2"


def test_crashes_between_child_and_counter_are_repaired_by_the_home_region_alone(
    tmp_path: Path,
) -> None:
    env = clean_env(tmp_path)
    tally("local", "up", "--regions", REGIONS, "--consistency", "strong", env=env)
    try:
        stack = load(Path(env["TALLY_STATE_DIR"]))
        assert stack is not None
        stacks = [stack.in_region(r) for r in stack.regions]
        written = write(stacks, seconds=8, threads=2, seed=3)
        held = items(stacks[0])  # what the writers left, before any reconciler ran
        pumped = tally("pump", "--until-settled", "--json", env=env)
        assert all(json.loads(line)["idle"] for line in pumped.stdout.splitlines())
        alerts = [json.loads(a) for a in tally("alerts", "--json", env=env).stdout.splitlines()]
        after = {s.region: items(s) for s in stacks}
    finally:
        tally("local", "down", env=env)

    def off(table: dict[tuple[str, str], dict[str, object]], post: str) -> int:
        likes = sum(1 for pk, sk in table if pk == post and sk.startswith("LIKE#"))
        return likes - int(str(table[(post, "META")]["likeTally"]))

    crashed = {post for post, n in written.crashed.items() if n}
    drift = Counter((a["region"], a["key"]["PK"]) for a in alerts if a["kind"] == "drift")
    statuses = Counter(a["repair"]["status"] for a in alerts if a["kind"] == "drift")
    issued = Counter((pk, int(sk.split("#")[1])) for pk, sk in held if sk.startswith("ISSUE#"))
    print(
        f"\nMRSC, 3 Regions: crashes {dict(written.crashed)}, likes {dict(written.likes)}, "
        f"numbers {sum(written.numbers.values())}; drift alerts {dict(drift)} {dict(statuses)}; "
        f"other alerts {Counter(a['kind'] for a in alerts if a['kind'] != 'drift')}"
    )
    assert crashed, "the run must crash some writers between child and counter"
    assert {post: off(held, post) for post in crashed} == {p: written.crashed[p] for p in crashed}
    assert set(drift) == {("us-east-1", post) for post in crashed}  # home only, no false one
    assert all(n == 1 for n in drift.values())
    assert statuses == {"applied": len(crashed)}  # written, though no transaction may be
    posts = sorted({pk for pk, sk in held if sk == "META" and pk.startswith("POST#")})
    for table in after.values():
        assert {post: off(table, post) for post in posts} == dict.fromkeys(posts, 0)
    assert written.transactions == 0
    assert all(n == 1 for n in written.numbers.values())  # no number handed out twice
    assert set(issued) == set(written.numbers)  # every number acknowledged, none lost
