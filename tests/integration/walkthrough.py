"""Running a page's walk-throughs as a new user would (docs/adopting.md, docs/local.md):
its `$ ` commands in order, in a user's shell in the checkout, each exiting 0 and printing
the lines the page shows under it ("..." stands for lines left out, or for the part of a
line that changes from run to run, such as a time); its bash and Python blocks too, unless
an HTML comment right above one says why not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.integration.test_readme import ROOT, Block, run

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


def shown_in(line: str, output: str) -> bool:
    """Whether ``output`` holds ``line``, each "..." in it standing for any text."""
    parts = [re.escape(part) for part in squeezed(line).split("...")]
    return re.search(".*?".join(parts), output) is not None


def user_env(state_dir: Path) -> dict[str, str]:
    """A new user's shell: no local endpoints or targets, a state directory of its own, and
    `tally` found on PATH as this interpreter's console script."""
    prefixes = ("AWS_ENDPOINT_URL", "DYNAMODB", "TABLE_NAME", "AUDIT_TABLE", "TALLY_TEMPLATE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.pop("RULES_FILE", None)
    env["TALLY_STATE_DIR"] = str(state_dir)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def section(text: str, heading: str) -> str:
    """The ``## heading`` section of a page, every other line blanked (line numbers kept)."""
    return _split(text, heading)[0]


def without_section(text: str, heading: str) -> str:
    """The page with its ``## heading`` section blanked (line numbers kept)."""
    return _split(text, heading)[1]


def _split(text: str, heading: str) -> tuple[str, str]:
    lines = text.splitlines()
    start = lines.index(f"## {heading}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    inside = ["" if not start <= i < end else line for i, line in enumerate(lines)]
    outside = ["" if start <= i < end else line for i, line in enumerate(lines)]
    return "\n".join(inside) + "\n", "\n".join(outside) + "\n"


def run_page(
    page: str,
    blocks: Iterable[Block],
    env: dict[str, str],
    *,
    before: Callable[[str], None] | None = None,
    outputs: list[tuple[str, str]] | None = None,
) -> int:
    """Run every block of ``page`` (its path, for messages) as written; stop the local stack
    at the end whatever happened. Returns how many blocks and commands ran. ``before`` is
    called with each block's code or command before it runs (a test's look at the stack);
    ``outputs`` collects each one's code and its stdout and stderr."""
    ran = 0
    try:
        for block in blocks:
            if block.skipped_because:
                continue
            if block.language in RUNNABLE:
                if before is not None:
                    before(block.code)
                result = run(block, env)
                assert result.returncode == 0, (block.line, result.stdout, result.stderr)
                if outputs is not None:
                    outputs.append((block.code, result.stdout + result.stderr))
                ran += 1
                continue
            if block.language != "console":
                continue
            for command in commands(block):
                if before is not None:
                    before(command.text)
                result = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", command.text],
                    env=env,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                said = f"{page} line {command.line}: {command.text}\n"
                assert result.returncode == 0, said + result.stdout + result.stderr
                assert "Traceback" not in result.stderr, said + result.stderr
                if outputs is not None:
                    outputs.append((command.text, result.stdout + result.stderr))
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
    return ran
