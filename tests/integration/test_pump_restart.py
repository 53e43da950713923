"""Interrupting the pump and starting it again: the real reconciler still finds every fault."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from tally.core.streams import StreamReader
from tally.handlers import recheck as recheck_handler
from tally.handlers import reconciler as reconciler_handler
from tally.local.checkpoint import Checkpoint
from tally.local.dynamodb_local import local_client_kwargs
from tally.local.pump import Pump
from tally.local.runner import exit_code, stopped_by_signals
from tally.local.stream_trigger import MappingSettings
from tally.reconciler.report.alerts import AlertPublisher
from tally.rules import load_rules
from tally.writers import TallyWriter
from tests.integration.conftest import RULES_FILE, Stack
from tests.utils import lambda_context

POSTS = [f"POST#restart-{n:02d}" for n in range(8)]


class Reconciler:
    """The real stream handler, remembering the batches it was given."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def __call__(self, event: dict[str, Any]) -> Any:
        self.batches.append([r["dynamodb"]["SequenceNumber"] for r in event["Records"]])
        return reconciler_handler.handler(event, lambda_context())


def pump(stack: Stack, checkpoint: Checkpoint, handler: Reconciler, endpoint: str) -> Pump:
    streams = boto3.client("dynamodbstreams", **local_client_kwargs(endpoint))
    reader = StreamReader(streams, stack.reader.stream_arn)
    reader.resume(checkpoint.load())
    failures = stack.sqs.create_queue(QueueName=f"{stack.table}-failures")["QueueUrl"]
    return Pump(
        reader,
        handler,
        lambda event: recheck_handler.handler(event, lambda_context()),
        stack.sqs,
        stack.recheck_queue,
        failures,
        MappingSettings(batch_size=10),
        checkpoint=checkpoint,
    )


def write_posts_with_a_fault_each(stack: Stack) -> None:
    """Each post: two likes through the writer, then one written behind its back (drift)."""
    writer = TallyWriter(stack.dynamodb, stack.table, load_rules(RULES_FILE))
    for post in POSTS:
        stack.put({"PK": post, "SK": "META", "likeTally": 0})
        for user in (1, 2):
            writer.add_child({"PK": post, "SK": f"LIKE#USER#{user}"})
        stack.put({"PK": post, "SK": "LIKE#USER#rogue"})


def to_the_process() -> None:
    """As a terminal sends Ctrl-C: to the process, whichever thread the kernel picks."""
    os.kill(os.getpid(), signal.SIGINT)


def to_the_sending_thread() -> None:
    """The kernel's least helpful pick: the thread sending the alert, which may be a worker
    the main thread is waiting on (a kernel may deliver a process's signal to any thread)."""
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)


def interrupt_after_alert(
    number: int,
    times: int,
    monkeypatch: pytest.MonkeyPatch,
    stopping: Pump,
    press: Callable[[], None] = to_the_process,
) -> None:
    """SIGINT this process ``times`` times just after the ``number``th alert: mid-handler.

    The alert may be sent from a worker thread, while the main thread handles signals: as a
    user's two key presses are, each SIGINT is sent once the one before it was handled (two
    sent at once would arrive as one).
    """
    send: Callable[[AlertPublisher, Any], None] = AlertPublisher.send
    published = 0
    lock = threading.Lock()

    def send_then_interrupt(self: AlertPublisher, message: Any) -> None:
        nonlocal published
        send(self, message)
        with lock:
            published += 1
            if published != number:
                return
        for pressed in range(times):
            if pressed:
                handled = time.monotonic() + 30
                while stopping.stop_signal is None and time.monotonic() < handled:
                    time.sleep(0.01)
            press()

    monkeypatch.setattr(AlertPublisher, "send", send_then_interrupt)


def drift_alerts(stack: Stack) -> list[str]:
    return sorted(a["key"]["PK"] for a in stack.alerts() if a["kind"] == "drift")


@pytest.mark.parametrize("press", [to_the_process, to_the_sending_thread])
def test_ctrl_c_twice_abandons_the_batch_and_the_restart_finds_every_fault(
    stack: Stack,
    dynamodb_endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    press: Callable[[], None],
) -> None:
    write_posts_with_a_fault_each(stack)
    checkpoint = Checkpoint(tmp_path / "checkpoint.json", stack.reader.stream_arn)
    first = Reconciler()
    stopped = pump(stack, checkpoint, first, dynamodb_endpoint)
    interrupt_after_alert(3, times=2, monkeypatch=monkeypatch, stopping=stopped, press=press)
    with stopped_by_signals(stopped):
        stopped.until_idle()
    monkeypatch.undo()
    assert exit_code(stopped) == 128 + signal.SIGINT
    # The batch in flight was abandoned mid-way, and not checkpointed.
    abandoned = first.batches[-1]
    saved = list(checkpoint.load().values())
    assert all(int(position) < int(abandoned[0]) for position in saved)
    assert saved == list(stopped.positions().values())
    alerted_first = drift_alerts(stack)
    # The third alert's batch was abandoned: its item collections under way (verified at
    # once) ended their group, no later batch was started.
    assert 3 <= len(alerted_first) < len(POSTS)

    second = Reconciler()
    pump(stack, checkpoint, second, dynamodb_endpoint).until_idle(rechecks=True)
    assert second.batches[0][0] == abandoned[0]
    # Every fault alerted once, across both runs, and repaired.
    assert sorted(alerted_first + drift_alerts(stack)) == POSTS
    assert [(stack.item(post, "META") or {}).get("likeTally") for post in POSTS] == [3] * len(POSTS)


def test_ctrl_c_once_lets_the_batch_finish_and_checkpoints_it(
    stack: Stack, dynamodb_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_posts_with_a_fault_each(stack)
    checkpoint = Checkpoint(tmp_path / "checkpoint.json", stack.reader.stream_arn)
    first = Reconciler()
    stopped = pump(stack, checkpoint, first, dynamodb_endpoint)
    interrupt_after_alert(1, times=1, monkeypatch=monkeypatch, stopping=stopped)
    with stopped_by_signals(stopped):
        stopped.until_idle()
    monkeypatch.undo()
    assert exit_code(stopped) == 128 + signal.SIGINT
    # The batch in flight finished and is the last one checkpointed; no other was started.
    finished = first.batches[-1]
    assert list(checkpoint.load().values()) == [finished[-1]]

    second = Reconciler()
    pump(stack, checkpoint, second, dynamodb_endpoint).until_idle(rechecks=True)
    assert int(second.batches[0][0]) > int(finished[-1])
    assert drift_alerts(stack) == POSTS
