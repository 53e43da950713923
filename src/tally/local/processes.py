"""The local stack's background processes, checked the same way on Linux and macOS (psutil)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil


def runs(pid: int, *arguments: str) -> bool:
    """Whether ``pid`` is alive and its command line holds each of ``arguments``.

    The arguments (a program's marker and its port) tell the process `up` started from
    another program that was given its pid later.
    """
    try:
        command_line = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return all(argument in command_line for argument in arguments)


def stop(pids: list[int], timeout: float) -> list[int]:
    """Terminate the processes, kill those that outlive ``timeout``; returns any that survive."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        pids = _wait_gone(pids, wait)
        if not pids:
            break
    return pids


def _gone(pid: int) -> bool:
    # Reap it if it is our own child (`up` and `down` in one process, as in the tests).
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    try:
        process = psutil.Process(pid)
        # An exited process whose parent is not us (maybe a PID 1 that never reaps) stays a
        # zombie that only its parent can remove; our own is reaped by the next call.
        return process.status() == psutil.STATUS_ZOMBIE and process.ppid() != os.getpid()
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` for the processes to exit; returns those still running."""
    deadline = time.monotonic() + timeout
    running = [pid for pid in pids if not _gone(pid)]
    while running and time.monotonic() < deadline:
        time.sleep(0.05)
        running = [pid for pid in running if not _gone(pid)]
    return running
