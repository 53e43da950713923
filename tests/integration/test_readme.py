"""README.md runs as written: its Python and shell blocks, in order, against the local stack.

A block that cannot run here says why in an HTML comment right above it
(``<!-- not run by tests/integration/test_readme.py: <reason> -->``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tally.local.template import template_path

ROOT = template_path().parent
README = ROOT / "README.md"
NOT_RUN = re.compile(r"<!-- not run by tests/integration/test_readme\.py: (.+?) -->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    language: str
    line: int
    code: str
    skipped_because: str | None


def blocks(text: str, not_run: re.Pattern[str] = NOT_RUN) -> Iterator[Block]:
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening or not opening.group(1):
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        before = lines[index - 1] if index else ""
        reason = not_run.match(before)
        code = "\n".join(lines[index + 1 : end]) + "\n"
        yield Block(opening.group(1), index + 1, code, reason.group(1) if reason else None)
        index = end + 1


RUNNABLE = {"bash", "sh", "python"}


def test_every_code_block_runs_or_says_why_not() -> None:
    found = [b for b in blocks(README.read_text()) if b.language in RUNNABLE]
    assert len(found) >= 4, "found too few blocks: the parsing is broken"
    assert [b.line for b in found if b.skipped_because is None], "no block would run"
    for block in found:
        assert block.skipped_because is None or block.skipped_because.strip(), block.line


@pytest.fixture
def session(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A reader's shell in the checkout: no local endpoints exported yet, the stack up."""
    prefixes = ("AWS_ENDPOINT_URL", "DYNAMODB", "TABLE_NAME", "AUDIT_TABLE", "TALLY_TEMPLATE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.pop("RULES_FILE", None)
    # Where the reader's .tally would be, kept apart from a developer's own local stack.
    env["TALLY_STATE_DIR"] = str(tmp_path / "state")
    # Docker, where it runs, would pull images: the README's `make invoke` runs in process.
    env["DOCKER"] = "false"
    tally = [sys.executable, "-m", "tally.cli"]
    subprocess.run([*tally, "local", "up"], env=env, cwd=ROOT, check=True, capture_output=True)
    exports = subprocess.run(
        [*tally, "local", "env"], env=env, cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    # Each block runs in a shell of its own: later ones find `tally` where the first one's
    # `source .venv/bin/activate` put it for the reader.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # The README's first runnable block is Python: the reader has `eval "$(tally local env)"`.
    for line in exports.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        [env[name]] = shlex.split(value)
    yield env
    subprocess.run([*tally, "local", "down"], env=env, cwd=ROOT, capture_output=True)


def run(block: Block, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if block.language == "python":
        command = [sys.executable, "-c", block.code]
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_readme_runs_as_written(session: dict[str, str]) -> None:
    outputs = []
    runnable = [
        b for b in blocks(README.read_text()) if b.language in RUNNABLE and not b.skipped_because
    ]
    # The writer block run twice, as a reader trying it again would: no counter is reset, so
    # the audit below still finds the table clean.
    writer = next(b for b in runnable if b.language == "python")
    for block in [writer, *runnable]:
        result = run(block, session)
        assert result.returncode == 0, (
            f"README.md line {block.line} ({block.language}) exited {result.returncode}:\n"
            f"{block.code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
        assert "Traceback" not in result.stderr, result.stderr
        outputs.append(result.stdout + result.stderr)
    text = "\n".join(outputs)
    # The writer snippet's outcomes, then the local session that verifies them.
    assert "created\ncreated\ncreated\ncreated\n(1,)\n" in text, text
    assert "local stack already running" in text
    assert "pump: idle." in text and "0 to the on-failure queue" in text
    assert ": clean" in text  # the writers' counters are consistent
    assert "invoke: no Docker: ReconcilerFunction in process against the local stack" in text
    # The rogue write the sample event records is found: the README and events/ tell one story.
    assert "invoke: records: 1 seen, none skipped\n" in text
    assert "1 parent checked (1 recount)" in text
    assert "invoke: finding: drift of likes at PK=POST#a91f,SK=META, repair applied\n" in text
    assert "stored 100 actual 3" in text
    assert "nothing alerted" not in text
    assert "stopped: moto server" in text
