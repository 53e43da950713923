"""The stream pump: what Lambda runs on the stream and the recheck queue, played locally.

It reads every shard about four times a second, fills batches up to the mapping's batch
size or batching window, and hands each shard's records to the stream trigger
(``stream_trigger``: the mapping's lanes, retries, bisection and on-failure queue). It also
feeds the recheck queue's due messages to the recheck handler through the queue trigger
(``sqs_trigger``), as SQS would (beside the stream when asked, as the two functions run side
by side in Lambda).

Like Lambda, it checkpoints a shard only past records whose fate is settled (handled, or
sent to the on-failure queue), and an outage of the stream or a queue is waited out, never
fatal: the records and messages it could not deliver are delivered once it is over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tally.core.regions import heartbeat_image
from tally.core.streams import StreamReader
from tally.local.checkpoint import Checkpoint
from tally.local.recheck_schedule import RecheckSchedule, waiting_line
from tally.local.sqs_trigger import Invoke, Outage, QueueDepth, QueueTrigger
from tally.local.stream_trigger import MappingSettings, StreamTrigger

Say = Callable[[str], None]
POLLS_PER_SECOND = 4
# Polls in a row that must find nothing to do before the pump calls itself idle: one empty
# poll can fall between a write and its stream record, or a delay ending and the receive.
QUIET_POLLS = 3
# The longest pause between polls while the stream or a queue does not answer.
MAX_OUTAGE_PAUSE = 2.0
# The reconciler's carry window when the template does not say (CARRY_SECONDS).
CARRY_SECONDS = 5.0


class PumpStopped(Exception):
    """A stop was requested: the invocation in flight finished, nothing more is started."""


@dataclass
class PumpReport:
    """What the pump delivered."""

    records: int = 0
    batches: int = 0
    retries: int = 0
    bisections: int = 0
    sent_to_failure_queue: int = 0
    rechecks: int = 0
    # Recheck messages the handler failed: SQS offers them again after their visibility.
    failed_rechecks: int = 0
    # Calls to the stream or a queue that failed; each is retried on a later poll.
    outages: int = 0
    # Rechecks still queued when the pump stopped: delayed, in flight, or (if not idle) due.
    pending_rechecks: int = 0
    # Most stream batches that ran at once (at most the ParallelizationFactor).
    concurrent_batches: int = 0
    # What the pump waits for while nothing is due: scheduled rechecks and until when.
    waiting: str = ""
    idle: bool = False
    failure_messages: list[dict[str, Any]] = field(default_factory=list)


class Pump:
    """Delivers the stream to the reconciler and the recheck queue to the recheck handler."""

    def __init__(
        self,
        reader: StreamReader,
        invoke_stream: Invoke,
        invoke_recheck: Invoke,
        sqs: Any,
        recheck_queue_url: str,
        failure_queue_url: str,
        settings: MappingSettings,
        say: Say | None = None,
        checkpoint: Checkpoint | None = None,
        *,
        carry_seconds: float = CARRY_SECONDS,
        schedule: RecheckSchedule | None = None,
        rechecks_beside: bool = False,
        recheck_lanes: int = 1,
        region: str = "us-east-1",
    ):
        """``rechecks_beside``: while running (``forever``), serve the recheck queue on
        ``recheck_lanes`` threads of its own (Lambda polls a standard queue with five
        concurrent batches while messages are waiting). Only for invokers whose invocations
        may overlap, such as the handlers called directly: ``tally pump``'s invokers swap
        the process's standard output and environment for each invocation, so it serves
        both in one loop."""
        if recheck_lanes < 1:
            raise ValueError(f"recheck_lanes must be at least 1, not {recheck_lanes}")
        self.recheck_lanes = recheck_lanes
        self.reader = reader
        self.sqs = sqs
        self.rechecks = QueueTrigger(sqs, recheck_queue_url, invoke_recheck, region=region)
        self.settings = settings
        self.say = say or (lambda _: None)
        self.checkpoint = checkpoint
        self.report = PumpReport()
        self.stream = StreamTrigger(
            reader,
            invoke_stream,
            sqs,
            failure_queue_url,
            settings,
            self.report,
            self.say,
            self._check_stop,
        )
        # The functions' carry window, and the rechecks they scheduled (when watched).
        self.carry_seconds = carry_seconds
        self.schedule = schedule or RecheckSchedule()
        self._saved = dict(self.stream.settled)
        self.stop_signal: int | None = None
        self._failing = 0  # polls in a row that met an outage
        self._outages = threading.local()  # per lane: outages it met
        self.rechecks_beside = rechecks_beside
        self._halted: Exception | None = None  # what ended a lane, ending both
        # The recheck lane and the stream's lanes run in threads: the report is shared.
        self._lock = threading.Lock()

    # --- running ---------------------------------------------------------------------

    def until_idle(self, max_seconds: float = 300.0, *, rechecks: bool = False) -> PumpReport:
        """Pump until QUIET_POLLS polls in a row find no record and no due recheck, and no
        recheck scheduled within the carry window (a carried remainder's recount) is still to
        come; with ``rechecks``, until every queued recheck (sequence grace, lag, deferral)
        has come due and been run. ``report.idle`` says whether that happened before
        ``max_seconds`` or a stop; ``report.waiting`` says what is awaited meanwhile.
        """
        deadline = time.monotonic() + max_seconds
        quiet = 0
        self.report.idle = False
        announced: float | None = None  # the wait last said, by its end
        try:
            while not self.stop_signal and time.monotonic() < deadline:
                outages = self.report.outages
                moved = self.step()
                depth = self.recheck_depth()
                if depth is not None:
                    self.report.pending_rechecks = depth.total
                awaited = self.schedule.waiting(None if rechecks else self.carry_seconds)
                self.report.waiting = waiting_line(awaited) if awaited else ""
                if awaited and not moved and awaited[-1].due != announced:
                    announced = awaited[-1].due
                    self.say(f"pump: {self.report.waiting}")
                busy = (
                    moved
                    or depth is None
                    or self.report.outages > outages
                    or depth.visible
                    or (rechecks and depth.total)
                    or bool(awaited and depth.delayed + depth.in_flight)
                )
                quiet = 0 if busy else quiet + 1
                if quiet >= QUIET_POLLS:
                    self.report.idle = True
                    break
                if not moved:
                    self._pause()
        except PumpStopped:
            pass
        self.report.waiting = ""
        return self.report

    def forever(self) -> None:
        """Pump until stopped, polling about four times a second.

        With ``rechecks_beside``, the recheck queue is served by a lane of its own, as Lambda
        runs the recheck function beside the stream function: a due recheck does not wait
        for a stream batch, nor a batch for a recheck. An error that ends either lane stops
        both and is raised here; a second stop abandons the lanes at once.
        """
        if not self.rechecks_beside:
            self._serve(self.step)
            return
        lanes = [
            threading.Thread(
                target=self._lane, args=(self._rechecks,), name=f"pump-rechecks-{n}", daemon=True
            )
            for n in range(self.recheck_lanes)
        ]
        for lane in lanes:
            lane.start()
        self._lane(self._stream)
        for lane in lanes:
            lane.join()
        if self._halted is not None:
            raise self._halted

    def _lane(self, work: Callable[[], int]) -> None:
        try:
            self._serve(work)
        except Exception as error:  # the other lane stops too, and forever() raises it
            with self._lock:
                self._halted = self._halted or error

    def _serve(self, work: Callable[[], int]) -> None:
        """Do ``work`` until stopped, pausing between rounds that moved nothing (longer
        while the service it calls is out)."""
        failing = 0
        try:
            while not self.stop_signal and self._halted is None:
                outages = self._own_outages()
                moved = work()
                failing = failing + 1 if self._own_outages() > outages else 0
                if not moved:
                    self._pause(failing)
        except PumpStopped:
            pass

    def stop(self, signal_number: int) -> None:
        """Stop once the invocation in flight returns; asked again, abandon it at once.

        Either way, the records of an unfinished batch are not checkpointed: the next pump
        delivers them again.
        """
        if self.stop_signal is not None:
            raise KeyboardInterrupt
        self.stop_signal = signal_number

    def _check_stop(self) -> None:
        """Called before each invocation: nothing more is started once a stop was requested."""
        if self.stop_signal:
            raise PumpStopped

    def step(self) -> int:
        """One round: deliver what the shards hold, then the due rechecks."""
        outages = self._own_outages()
        moved = self._stream() + self._rechecks()
        self._failing = self._failing + 1 if self._own_outages() > outages else 0
        return moved

    def positions(self) -> dict[str, str]:
        """Per shard, the sequence number of the last settled record: the checkpoint."""
        return dict(self.stream.settled)

    def _pause(self, failing: int | None = None) -> None:
        failing = self._failing if failing is None else failing
        if not self.stop_signal:
            time.sleep(min(MAX_OUTAGE_PAUSE, 2**failing / POLLS_PER_SECOND))

    def _own_outages(self) -> int:
        """Outages met by the calling thread's lane (the report counts every lane's)."""
        return getattr(self._outages, "count", 0)

    def _outage(self, what: str, error: Exception) -> None:
        self._outages.count = self._own_outages() + 1
        with self._lock:
            self.report.outages += 1
        self.say(f"pump: {what} failed ({type(error).__name__}: {error}); trying again")

    # --- the stream ---------------------------------------------------------------------

    def _stream(self) -> int:
        try:
            gathered = self._gather()
        except Outage as error:
            self._outage("reading the stream", error)
            return 0
        moved = 0
        shards = list(gathered.items())
        for index, (shard_id, records) in enumerate(shards):
            try:
                self.stream.deliver_shard(shard_id, records)
            except Outage as error:
                self._rewind(shards[index + 1 :])
                self._outage("sending to the on-failure queue", error)
                return moved
            except BaseException:  # a stop: what was read but not settled is read again
                self._rewind(shards[index + 1 :])
                raise
            finally:
                self._save()
            # A Global Table's heartbeats come for as long as the stack runs: only the others
            # keep the pump from idle.
            moved += sum(1 for r in records if heartbeat_image(r) is None)
        return moved

    def _gather(self) -> dict[str, list[dict[str, Any]]]:
        """Records per shard, read until a lane's batch is full or the window closes."""
        size = self.settings.batch_size * self.settings.parallelization
        gathered: dict[str, list[dict[str, Any]]] = {}
        window_ends = time.monotonic() + self.settings.window_seconds
        while True:
            try:
                polled = self.reader.poll_batches(limit=size)
            except Outage as error:
                if not gathered:
                    raise
                self._outage("reading the stream", error)  # deliver what was read
                break
            for shard_id, records in polled:
                gathered.setdefault(shard_id, []).extend(records)
            full = any(len(r) >= self.settings.batch_size for r in gathered.values())
            if not gathered or full or time.monotonic() >= window_ends:
                break
            time.sleep(min(1 / POLLS_PER_SECOND, max(0.0, window_ends - time.monotonic())))
        return gathered

    def _rewind(self, shards: list[tuple[str, list[dict[str, Any]]]]) -> None:
        """Make the reader hand out again every record of ``shards`` (read, not delivered)."""
        for shard_id, records in shards:
            if records:
                self.reader.rewind(shard_id, records[0]["dynamodb"]["SequenceNumber"])

    def _save(self) -> None:
        settled = self.stream.settled
        if self.checkpoint is not None and settled != self._saved:
            self.checkpoint.save(settled)
            self._saved = dict(settled)

    # --- the recheck queue -------------------------------------------------------------

    def _rechecks(self) -> int:
        delivered = 0
        while True:
            self._check_stop()
            try:
                delivery = self.rechecks.deliver_batch()
            except Outage as error:
                self._outage("the recheck queue", error)
                return delivered
            if delivery is None:
                return delivered
            delivered += delivery.handled
            with self._lock:
                self.report.rechecks += delivery.handled
                self.report.failed_rechecks += delivery.failed
            if delivery.error is not None:
                self.say(
                    f"pump: recheck handler raised {type(delivery.error).__name__}: "
                    f"{delivery.error}; {delivery.failed} rechecks come back in "
                    f"{self.rechecks.visibility_seconds} s"
                )
            if delivery.failed:
                return delivered

    def recheck_depth(self) -> QueueDepth | None:
        """The recheck queue's counts, or None while it does not answer."""
        try:
            return self.rechecks.depth()
        except Outage as error:
            self._outage("the recheck queue", error)
            return None
