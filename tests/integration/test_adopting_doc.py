"""docs/adopting.md runs as written: each walk-through's `$ ` commands, in order, in a new
user's shell in the checkout, each exiting 0 and printing the lines the page shows under it
("..." stands for lines left out); its bash and Python blocks too, unless an HTML comment
right above one says why not
(``<!-- not run by tests/integration/test_adopting_doc.py: <reason> -->``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.integration.test_readme import ROOT, Block, blocks, run

DOC = ROOT / "docs" / "adopting.md"
NOT_RUN = re.compile(r"<!-- not run by tests/integration/test_adopting_doc\.py: (.+?) -->\s*$")
RUNNABLE = {"bash", "sh", "python"}


@dataclass(frozen=True)
class Command:
    line: int
    text: str
    shown: list[str]  # the output lines the page shows under it


def commands(block: Block) -> list[Command]:
    """A console block's `$ ` commands (a trailing backslash continues one) and their output."""
    found: list[Command] = []
    lines = block.code.splitlines()
    index = 0
    while index < len(lines):
        if not lines[index].startswith("$ "):
            found[-1].shown.append(lines[index]) if found else None
            index += 1
            continue
        start, text = index, lines[index][2:]
        while text.endswith("\\"):
            index += 1
            text = text[:-1] + " " + lines[index].strip()
        found.append(Command(block.line + 1 + start, text, []))
        index += 1
    return found


def squeezed(text: str) -> str:
    return " ".join(text.split())


def page() -> list[Block]:
    return list(blocks(DOC.read_text(), NOT_RUN))


def test_every_block_runs_or_says_why_not() -> None:
    walks = [b for b in page() if b.language == "console" and commands(b)]
    assert len(walks) >= 6, "found too few walk-through blocks: the parsing is broken"
    for block in page():
        if block.language in RUNNABLE:
            assert block.skipped_because is None or block.skipped_because.strip(), block.line
    # Every walk-through starts its stack, loads its example and stops it again.
    ups = [c.text for b in walks for c in commands(b) if c.text.startswith("tally local up")]
    loads = [c.text for b in walks for c in commands(b) if c.text.startswith("tally examples")]
    downs = [c.text for b in walks for c in commands(b) if c.text == "tally local down"]
    assert len(ups) == len(downs) == 3 and len(loads) == 6, (ups, loads, downs)


def test_the_walk_throughs_run_as_written(tmp_path: Path) -> None:
    prefixes = ("AWS_ENDPOINT_URL", "DYNAMODB", "TABLE_NAME", "AUDIT_TABLE", "TALLY_TEMPLATE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.pop("RULES_FILE", None)
    env["TALLY_STATE_DIR"] = str(tmp_path / "state")
    # `tally` as the reader's shell finds it: this interpreter's console script.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    try:
        for block in page():
            if block.skipped_because:
                continue
            if block.language in RUNNABLE:
                result = run(block, env)
                assert result.returncode == 0, (block.line, result.stdout, result.stderr)
                continue
            if block.language != "console":
                continue
            for command in commands(block):
                result = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", command.text],
                    env=env,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                said = f"docs/adopting.md line {command.line}: {command.text}\n"
                assert result.returncode == 0, said + result.stdout + result.stderr
                assert "Traceback" not in result.stderr, said + result.stderr
                output = squeezed(result.stdout + "\n" + result.stderr)
                for line in command.shown:
                    if line.strip() and line.strip() != "...":
                        assert squeezed(line) in output, said + f"missing: {line}\n" + output
    finally:
        subprocess.run(
            [sys.executable, "-m", "tally.cli", "local", "down"],
            env=env,
            cwd=ROOT,
            capture_output=True,
        )
