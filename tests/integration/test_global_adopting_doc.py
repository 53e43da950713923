"""docs/adopting.md's "Seed 003 on a Global Table" runs as written (its commands and blocks in
order, in a new user's shell in the checkout, each printing what the page shows), and does what
it says: seed 003's writer racing in two Regions hands out one number twice, one item replaces
the other and nothing is alerted; adopted (two stamps on its put), the same race is alerted
exactly once, by the Region whose item was replaced, with the attributes its writer wrote.
The page's other walk-throughs are test_adopting_doc.py's.
"""

from __future__ import annotations

import difflib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from tally.core.regions import CHILD_ID, HEARTBEAT_PREFIX, ORIGIN
from tests.integration.test_readme import ROOT, Block, blocks
from tests.integration.walkthrough import RUNNABLE, commands, run_page, section, user_env

DOC = ROOT / "docs" / "adopting.md"
HEADING = "Seed 003 on a Global Table"
NOT_RUN = re.compile(
    r"<!-- not run by tests/integration/test_global_adopting_doc\.py: (.+?) -->\s*$"
)
HOME, OTHER = "us-east-1", "eu-west-1"
TOOK = re.compile(r"^(\S+) took (\d+)$", re.MULTILINE)
HEREDOC = re.compile(r"<<'EOF'\n(.*?)\nEOF\n", re.DOTALL)


def page() -> list[Block]:
    return list(blocks(section(DOC.read_text(), HEADING), NOT_RUN))


def writers() -> list[str]:
    """The Python of each block that defines the writer: the seed's, then the adopted one."""
    return [
        HEREDOC.findall(b.code)[0]
        for b in page()
        if b.language in RUNNABLE and "take_number()" in b.code
    ]


def test_every_block_runs_and_the_stack_is_started_and_stopped_once() -> None:
    assert all(b.skipped_because is None for b in page())
    ran = [c.text for b in page() if b.language == "console" for c in commands(b)]
    assert len([c for c in ran if c.startswith("tally local up --regions")]) == 1, ran
    assert ran[-1] == "tally local down", ran


def test_the_adoption_adds_the_two_stamps_to_the_put_and_changes_nothing_else() -> None:
    seed, adopted = writers()
    diff = difflib.ndiff(seed.splitlines(), adopted.splitlines())
    changes = [f"{line[0]} {line[2:].strip()}" for line in diff if line.startswith(("+ ", "- "))]
    assert changes == [
        "+ import uuid",
        f'+ "{ORIGIN}": {{"S": region}},',
        f'+ "{CHILD_ID}": {{"S": f"{{region}}:{{uuid.uuid4().hex}}"}},',
    ], changes


def shell(env: dict[str, str], script: str) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def held(env: dict[str, str], region: str) -> dict[str, dict[str, str]]:
    """Every item of the team's ``region`` holds, by its key: attribute name to value (as
    strings); the stack's heartbeat items (one per Region, docs/global-tables.md) left out."""
    scan = (
        f'eval "$(tally local env --region {region} 2> /dev/null)"\n'
        "python -c 'import boto3, json, os\n"
        'items = boto3.client("dynamodb").scan(TableName=os.environ["TABLE_NAME"])["Items"]\n'
        "print(json.dumps(items))'"
    )
    items = json.loads(shell(env, scan))
    plain = [{name: next(iter(v.values())) for name, v in item.items()} for item in items]
    return {item["pk"]: item for item in plain if not item["pk"].startswith(HEARTBEAT_PREFIX)}


def test_seed_003_on_a_global_table_loses_a_number_and_adopted_alerts_it_once(
    tmp_path: Path,
) -> None:
    env = user_env(tmp_path / "state")
    seen: dict[str, Any] = {}

    def before(text: str) -> None:
        if text == "tally local down":  # the stack as the page leaves it, before it stops
            lines = shell(env, "tally alerts --json").splitlines()
            seen["alerts"] = [json.loads(line) for line in lines if line.strip()]
            seen["held"] = {r: held(env, r) for r in (HOME, OTHER)}

    outputs: list[tuple[str, str]] = []
    assert run_page("docs/adopting.md", page(), env, before=before, outputs=outputs) >= 9

    # Both races: each Region's writer was told the same number, against its own replica.
    races = [dict(TOOK.findall(out)) for code, out in outputs if "take_number()" in code]
    assert races == [{OTHER: "0", HOME: "0"}, {OTHER: "1", HOME: "1"}], outputs
    # Replication kept one item per number in both Regions: the one written last (HOME's).
    for region, items in seen["held"].items():
        assert sorted(items) == ["0", "1", "counter"], (region, items)
        assert items["counter"]["count_value"] == "2"  # two numbers locked, not four
        assert items["0"] == {"pk": "0", "some_attribute": f"taken in {HOME}"}
        assert items["1"]["some_attribute"] == f"taken in {HOME}"
        assert items["1"][ORIGIN] == HOME
    winner = seen["held"][HOME]["1"][CHILD_ID]
    assert winner == seen["held"][OTHER]["1"][CHILD_ID] and winner.startswith(f"{HOME}:")

    # One alert across both Regions and both races: the seed's writer's loss went unseen,
    # the adopted writer's was alerted by the Region that lost its item, and by it alone.
    [alert] = seen["alerts"]
    assert (alert["kind"], alert["region"], alert["rule"]) == ("overwritten", OTHER, "numbers")
    assert alert["key"] == {"pk": "1"} and alert["severity"] == "critical"
    assert alert["stored"] == {"pk": "1", "some_attribute": f"taken in {OTHER}"}
    assert alert["actual"] == {"child_id": winner, "region": HOME}
    assert f"(id {OTHER}:" in alert["detail"] and alert["repair"]["status"] == "skipped"
