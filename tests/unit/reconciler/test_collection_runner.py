"""A batch's item collections in worker threads: a signal the kernel hands a worker still
reaches the main thread, which runs Python's signal handlers."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tally.reconciler.checks.batches import CollectionRunner, awaited
from tally.reconciler.stats import Done, StatsBook
from tally.reconciler.stream.changes import Group
from tally.rules import load_rules
from tests.unit.writers.test_writer_items import RULES_FILE

HANDLED_WITHIN_SECONDS = 5.0


def waiting_in(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` is inside a call of ``function`` (a Condition's ``wait``)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def handled() -> Iterator[threading.Event]:
    """SIGINT sets the event (in the main thread, where Python runs handlers)."""
    event = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: event.set())
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_signal_a_worker_receives_is_handled_while_the_main_thread_waits_on_it(
    handled: threading.Event,
) -> None:
    """The worker waits for the handler: a main thread that only woke when its workers ended
    would leave both waiting, and two presses of Ctrl-C would arrive as one."""
    rule = load_rules(RULES_FILE)["likes"]
    collections = [
        [Group(rule, {"PK": f"POST#{n}", "SK": "META"}, sequence_numbers=[str(n)])]
        for n in range(2)
    ]
    waits: list[float] = []

    def verify(group: Group, done: Done) -> None:
        if group.parent_key["PK"] == "POST#0":
            while not waiting_in(threading.main_thread(), "wait"):  # on its workers
                time.sleep(0.001)
            # Into the lock's wait, below Python (the pause only makes the main thread's
            # blocking likelier; it decides nothing in the assertions below).
            time.sleep(0.2)
            started = time.monotonic()
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # to this worker
            handled.wait(HANDLED_WITHIN_SECONDS)
            waits.append(time.monotonic() - started)

    failed, _ = CollectionRunner(StatsBook(), concurrency=2).run(
        collections, verify, needs_no_table=lambda groups: False, deadline=None
    )
    assert failed == []
    assert handled.is_set()
    assert waits and waits[0] < HANDLED_WITHIN_SECONDS


def test_work_that_raised_a_timeout_of_its_own_raises_it_to_the_waiting_thread() -> None:
    """A socket's timeout is Python's ``TimeoutError``, as a wait's step that ended is: the
    waiting must not take one for the other and wait for ever."""

    def read() -> None:
        raise TimeoutError("read timed out")

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(read)
        with pytest.raises(TimeoutError, match="read timed out"):
            awaited(future)
