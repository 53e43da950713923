"""docs/local.md runs as written: its `$ ` commands in order, in a new user's shell in the
checkout, each exiting 0 and printing the lines the page shows under it ("..." stands for
lines left out, or for the part of a line that changes from run to run, such as a time); its
bash and Python blocks too, unless an HTML comment right above one says why not
(``<!-- not run by tests/integration/test_local_doc.py: <reason> -->``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.integration.test_adopting_doc import commands, squeezed
from tests.integration.test_readme import ROOT, Block, blocks, run

DOC = ROOT / "docs" / "local.md"
NOT_RUN = re.compile(r"<!-- not run by tests/integration/test_local_doc\.py: (.+?) -->\s*$")
RUNNABLE = {"bash", "sh", "python"}


def page() -> list[Block]:
    return list(blocks(DOC.read_text(), NOT_RUN))


def shown_in(line: str, output: str) -> bool:
    """Whether ``output`` holds ``line``, each "..." in it standing for any text."""
    parts = [re.escape(part) for part in squeezed(line).split("...")]
    return re.search(".*?".join(parts), output) is not None


def test_every_block_runs_or_says_why_not() -> None:
    walks = [b for b in page() if b.language == "console" and commands(b)]
    assert walks, "found no walk-through block: the parsing is broken"
    for block in page():
        if block.language in RUNNABLE:
            assert block.skipped_because is None or block.skipped_because.strip(), block.line


def test_a_shown_line_matches_with_its_elisions() -> None:
    assert shown_in("due ... UTC (in 30 s)", "x due 09:00:01 UTC (in 30 s) y")
    assert not shown_in("due ... UTC (in 30 s)", "due 09:00:01 UTC (in 29 s)")


def test_docs_local_runs_as_written(tmp_path: Path) -> None:
    prefixes = ("AWS_ENDPOINT_URL", "DYNAMODB", "TABLE_NAME", "AUDIT_TABLE", "TALLY_TEMPLATE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.pop("RULES_FILE", None)
    env["TALLY_STATE_DIR"] = str(tmp_path / "state")
    # `tally` as the reader's shell finds it, and `make invoke` in process (Docker would pull).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["DOCKER"] = "false"
    ran = 0
    try:
        for block in page():
            if block.skipped_because:
                continue
            if block.language in RUNNABLE:
                result = run(block, env)
                assert result.returncode == 0, (block.line, result.stdout, result.stderr)
                ran += 1
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
                said = f"docs/local.md line {command.line}: {command.text}\n"
                assert result.returncode == 0, said + result.stdout + result.stderr
                assert "Traceback" not in result.stderr, said + result.stderr
                output = squeezed(result.stdout + "\n" + result.stderr)
                for line in command.shown:
                    if line.strip() and line.strip() != "...":
                        assert shown_in(line, output), said + f"missing: {line}\n" + output
                ran += 1
    finally:
        subprocess.run(
            [sys.executable, "-m", "tally.cli", "local", "down"],
            env=env,
            cwd=ROOT,
            capture_output=True,
        )
    assert ran >= 3
