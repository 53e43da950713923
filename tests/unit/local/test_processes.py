"""The local stack's process checks, on real processes (psutil: the same on Linux and macOS)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from tally.local import processes

# Sleeps until killed; its arguments are what `runs` looks for (a marker and a port).
SLEEPER = "import sys, time\nwhile True: time.sleep(0.05)"
IGNORES_TERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + (
    "print('ready', flush=True)\nwhile True: time.sleep(0.05)"
)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", SLEEPER, "moto.server", "-p", "4567"])
    # Until the child has exec'd, its command line is still its parent's: wait for it.
    started = psutil.Process(process.pid)
    for _ in range(10_000):
        if "moto.server" in started.cmdline():
            break
        psutil.wait_procs([started], timeout=0.001)
    yield process
    process.kill()
    process.wait()


def test_runs_recognises_the_program_by_its_arguments(sleeper: subprocess.Popen[bytes]) -> None:
    assert processes.runs(sleeper.pid, "moto.server", "4567")
    assert not processes.runs(sleeper.pid, "moto.server", "4568")  # another port
    assert not processes.runs(sleeper.pid, "DynamoDBLocal.jar", "4567")  # another program
    assert not processes.runs(os.getpid(), "moto.server", "4567")  # a pid running else


def test_stop_ends_the_process_and_it_no_longer_runs(sleeper: subprocess.Popen[bytes]) -> None:
    assert processes.stop([sleeper.pid], timeout=10) == []
    assert not processes.runs(sleeper.pid, "moto.server", "4567")
    # Our own child was reaped on the way: no zombie is left behind.
    with pytest.raises(ChildProcessError):
        os.waitpid(sleeper.pid, os.WNOHANG)


def test_stop_kills_a_process_that_ignores_sigterm() -> None:
    process = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    assert processes.stop([process.pid], timeout=0.2) == []
    assert not processes.runs(process.pid)


def test_a_pid_that_never_existed_is_not_running_and_stops_at_once() -> None:
    unused = max(psutil.pids()) + 10_000
    assert not processes.runs(unused)
    assert processes.stop([unused], timeout=1) == []
