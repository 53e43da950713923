"""`tally ... | head`: the reader goes away before the output ends; the command stops quietly
with the shell's exit code for a closed pipe, never a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys

PRINTS_MUCH = """
import sys
from tally.cli import console

def command() -> int:
    for n in range(1_000_000):
        print(f"line {n} of an output far longer than any pipe's buffer")
    return 0

sys.exit(console.run(command))
"""


def test_a_reader_that_goes_away_stops_the_command_quietly() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", PRINTS_MUCH],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.read(10) == b"line 0 of "  # as `head -c 10` reads
    child.stdout.close()
    said = child.stderr.read().decode()
    assert child.wait(timeout=60) == 128 + signal.SIGPIPE
    assert said == ""
