"""The stream pump: Lambda's DynamoDB event source mapping, played against DynamoDB Local.

It reads every shard about four times a second, fills batches up to the mapping's batch
size or batching window, invokes the handler the template names, and honours the
mapping's settings: partial batch responses (retry from the first failed record),
bisection on a function error, a retry limit, and the on-failure queue after it. It also
feeds the recheck queue's due messages to the recheck handler, as SQS would (beside the
stream when asked, as the two functions run side by side in Lambda).

With a ParallelizationFactor N above 1 it runs up to N batches of one shard at once, as
Lambda does: each record goes to a lane chosen by its item's key (partition and sort key),
so one item's records stay in order while two items of one item collection may be
verified in concurrent batches, in either order.

Like Lambda, it checkpoints a shard only past records whose fate is settled (handled, or
sent to the on-failure queue), and an outage of the stream or a queue is waited out, never
fatal: the records and messages it could not deliver are delivered once it is over.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from tally.core.streams import StreamReader
from tally.core.timefmt import epoch_iso, iso
from tally.local.checkpoint import Checkpoint
from tally.local.sqs_trigger import Invoke, Outage, QueueDepth, QueueTrigger, failed_identifiers

Say = Callable[[str], None]
POLLS_PER_SECOND = 4
# Polls in a row that must find nothing to do before the pump calls itself idle: one empty
# poll can fall between a write and its stream record, or a delay ending and the receive.
QUIET_POLLS = 3
# The longest pause between polls while the stream or a queue does not answer.
MAX_OUTAGE_PAUSE = 2.0
# The reconciler's carry window when the template does not say (CARRY_SECONDS).
CARRY_SECONDS = 5.0
# SQS's delays are whole seconds and its counts approximate: a recheck is looked for this long
# after it should have come due.
DUE_MARGIN = 1.5


@dataclass(frozen=True)
class Scheduled:
    """A recheck a function sent to the recheck queue: when it comes due and why."""

    due: float  # time.time()
    delay: int
    rule: str
    key: str
    reason: str

    def describe(self, now: float) -> str:
        until = datetime.fromtimestamp(self.due).strftime("%H:%M:%S")
        left = max(0.0, self.due - now)
        return f"{self.reason} of {self.rule} {self.key}, due {until} (in {left:.0f} s)"


class RecheckSchedule:
    """The rechecks the functions schedule, seen as they send them (SQS tells only how many
    messages are delayed, not until when): what the pump waits for, and until when."""

    def __init__(self) -> None:
        self._scheduled: list[Scheduled] = []
        self._lock = threading.Lock()

    def watch(self, sqs_client: Any) -> None:
        """Note every recheck ``sqs_client`` (a function's own client) sends from now on."""
        sqs_client.meta.events.register(
            "before-parameter-build.sqs.SendMessage", self._sent, unique_id=f"pump-{id(self)}"
        )

    def _sent(self, params: Mapping[str, Any], **_: Any) -> None:
        try:
            body = json.loads(params.get("MessageBody", ""))
            key = "/".join(str(v) for v in body["key"].values())
            rule, reason = str(body["rule"]), str(body.get("reason") or "recheck")
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # not a recheck
        delay = int(params.get("DelaySeconds") or 0)
        now = time.time()
        with self._lock:  # a pump that runs for days keeps only what is still to come
            self._scheduled = [s for s in self._scheduled if s.due + DUE_MARGIN > now]
            self._scheduled.append(Scheduled(now + delay, delay, rule, key, reason))

    def waiting(self, within: float | None = None) -> list[Scheduled]:
        """Rechecks not yet looked for (due plus a margin), soonest first; with ``within``,
        only those whose delay is at most that many seconds."""
        now = time.time()
        with self._lock:
            self._scheduled = [s for s in self._scheduled if s.due + DUE_MARGIN > now]
            pending = sorted(self._scheduled, key=lambda s: s.due)
        return [s for s in pending if within is None or s.delay <= within]


def waiting_line(waiting: list[Scheduled]) -> str:
    """What the pump waits for, in one line."""
    now = time.time()
    last = waiting[-1]
    reasons = ", ".join(sorted({s.reason for s in waiting}))
    until = datetime.fromtimestamp(last.due).strftime("%H:%M:%S")
    return (
        f"waiting for {len(waiting)} recheck{'s' if len(waiting) != 1 else ''} ({reasons}) "
        f"until {until}, {max(0, last.due - now):.0f} s; next: {waiting[0].describe(now)}"
    )


class PumpStopped(Exception):
    """A stop was requested: the invocation in flight finished, nothing more is started."""


@dataclass(frozen=True)
class MappingSettings:
    """The event source mapping's behaviour, as template.yaml declares it."""

    batch_size: int = 100
    window_seconds: float = 0.0
    max_retries: int = 5
    bisect: bool = True
    partial_responses: bool = True
    parallelization: int = 1  # concurrent batches per shard (ParallelizationFactor)

    def __post_init__(self) -> None:
        if not 1 <= self.parallelization <= 10:
            raise ValueError(f"ParallelizationFactor must be 1 to 10, not {self.parallelization}")
        if self.batch_size < 1:
            raise ValueError(f"BatchSize must be at least 1, not {self.batch_size}")

    @classmethod
    def from_event(
        cls, properties: Mapping[str, Any], parameters: Mapping[str, str]
    ) -> MappingSettings:
        def value(name: str, default: Any) -> Any:
            raw = properties.get(name, default)
            if isinstance(raw, Mapping) and "Ref" in raw:
                return parameters[raw["Ref"]]
            return raw

        return cls(
            batch_size=int(value("BatchSize", 100)),
            window_seconds=float(value("MaximumBatchingWindowInSeconds", 0)),
            max_retries=int(value("MaximumRetryAttempts", -1)),
            bisect=str(value("BisectBatchOnFunctionError", False)).lower() == "true",
            partial_responses="ReportBatchItemFailures"
            in properties.get("FunctionResponseTypes", []),
            parallelization=int(value("ParallelizationFactor", 1)),
        )

    @classmethod
    def from_template(
        cls, template: Mapping[str, Any], function_id: str = "ReconcilerFunction", **overrides: Any
    ) -> MappingSettings:
        """The settings of ``function_id``'s DynamoDB event source, at the parameters' defaults;
        ``overrides`` (e.g. ``parallelization=10``) replace single fields."""
        from tally.local.functions import function, parameter_defaults

        spec = function(template, function_id)
        stream = next(e for e in spec.events.values() if e.get("Type") == "DynamoDB")
        settings = cls.from_event(stream["Properties"], parameter_defaults(template))
        given = {name: value for name, value in overrides.items() if value is not None}
        return replace(settings, **given) if given else settings


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
    ):
        """``rechecks_beside``: while running (``forever``), serve the recheck queue on a
        thread of its own. Only for invokers whose invocations may overlap, such as the
        handlers called directly: ``tally pump``'s invokers swap the process's standard
        output and environment for each invocation, so it serves both in one loop."""
        self.reader = reader
        self.invoke_stream = invoke_stream
        self.sqs = sqs
        self.rechecks = QueueTrigger(sqs, recheck_queue_url, invoke_recheck)
        self.failure_queue_url = failure_queue_url
        self.settings = settings
        self.say = say or (lambda _: None)
        self.checkpoint = checkpoint
        self.report = PumpReport()
        # The functions' carry window, and the rechecks they scheduled (when watched).
        self.carry_seconds = carry_seconds
        self.schedule = schedule or RecheckSchedule()
        # Per shard, the last record whose fate is settled: what a checkpoint may name.
        self.settled: dict[str, str] = reader.positions()
        self._saved = dict(self.settled)
        self.stop_signal: int | None = None
        self._failing = 0  # polls in a row that met an outage
        self._outages = threading.local()  # per lane: outages it met
        self.rechecks_beside = rechecks_beside
        self._halted: Exception | None = None  # what ended a lane, ending both
        # Lanes run in threads: the report and the settled sequence numbers are shared.
        self._lock = threading.Lock()
        self._done: dict[str, set[str]] = {}  # per shard, records settled this round
        self._running = 0

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
        lane = threading.Thread(
            target=self._lane, args=(self._rechecks,), name="pump-rechecks", daemon=True
        )
        lane.start()
        self._lane(self._stream)
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

    def step(self) -> int:
        """One round: deliver what the shards hold, then the due rechecks."""
        outages = self._own_outages()
        moved = self._stream() + self._rechecks()
        self._failing = self._failing + 1 if self._own_outages() > outages else 0
        return moved

    def positions(self) -> dict[str, str]:
        """Per shard, the sequence number of the last settled record: the checkpoint."""
        return dict(self.settled)

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
                self._deliver_shard(shard_id, records)
            except Outage as error:
                self._rewind(shards[index + 1 :])
                self._outage("sending to the on-failure queue", error)
                return moved
            except BaseException:  # a stop: what was read but not settled is read again
                self._rewind(shards[index + 1 :])
                raise
            finally:
                self._save()
            moved += len(records)
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

    def batches(self, records: list[dict[str, Any]]) -> list[list[list[dict[str, Any]]]]:
        """One shard's records as lanes of batches: a record's lane is chosen by its item's
        key, so each item keeps its order within its lane; each lane is cut into batches."""
        factor, size = self.settings.parallelization, self.settings.batch_size
        lanes: list[list[dict[str, Any]]] = [[] for _ in range(factor)]
        for record in records:
            lanes[lane_of(record, factor)].append(record)
        return [
            [lane[start : start + size] for start in range(0, len(lane), size)]
            for lane in lanes
            if lane
        ]

    def _deliver_shard(self, shard_id: str, records: list[dict[str, Any]]) -> None:
        """Deliver one shard's records, up to ParallelizationFactor batches at once; the
        checkpoint then moves past the longest run of settled records."""
        lanes = self.batches(records)
        try:
            if len(lanes) == 1:
                self._run_lane(shard_id, lanes[0])
                return
            with ThreadPoolExecutor(len(lanes), thread_name_prefix="pump-lane") as pool:
                futures = [pool.submit(self._run_lane, shard_id, lane) for lane in lanes]
                errors = [f.exception() for f in futures]
            raised = [e for e in errors if e is not None]
            if raised:  # a stop first, then an outage: either leaves the rest to a later poll
                raise next((e for e in raised if not isinstance(e, Outage)), raised[0])
        finally:
            self._advance(shard_id, records)

    def _run_lane(self, shard_id: str, batches: list[list[dict[str, Any]]]) -> None:
        for batch in batches:
            with self._lock:
                self._running += 1
                self.report.concurrent_batches = max(self.report.concurrent_batches, self._running)
            try:
                self._deliver(shard_id, batch, attempt=0)
            finally:
                with self._lock:
                    self._running -= 1

    def _deliver(self, shard_id: str, records: list[dict[str, Any]], attempt: int) -> None:
        if self.stop_signal:
            raise PumpStopped
        with self._lock:
            self.report.batches += 1
        try:
            response = self.invoke_stream({"Records": records})
        except Exception as error:  # a function error: retry, bisect, or give up
            self.say(f"pump: handler raised {type(error).__name__}: {error}")
            if self.settings.bisect and len(records) > 1:
                with self._lock:
                    self.report.bisections += 1
                half = len(records) // 2
                self._deliver(shard_id, records[:half], attempt + 1)
                self._deliver(shard_id, records[half:], attempt + 1)
                return
            self._retry_or_fail(shard_id, records, attempt, "Unhandled")
            return
        failed = failed_identifiers(response) if self.settings.partial_responses else []
        numbers = [int(r["dynamodb"]["SequenceNumber"]) for r in records]
        if not failed:
            self._settle(shard_id, records)
            return
        # Lambda retries from the first failed record; an identifier not in the batch fails it all.
        first = min(int(n) for n in failed) if all(n.isdigit() for n in failed) else -1
        done = numbers.index(first) if first in numbers else 0
        self._settle(shard_id, records[:done])
        self._retry_or_fail(shard_id, records[done:], attempt, None)

    def _settle(self, shard_id: str, records: list[dict[str, Any]]) -> None:
        """These records' fate is decided: the checkpoint may move past them."""
        with self._lock:
            self.report.records += len(records)
            self._done.setdefault(shard_id, set()).update(
                r["dynamodb"]["SequenceNumber"] for r in records
            )

    def _advance(self, shard_id: str, records: list[dict[str, Any]]) -> None:
        """Checkpoint past the longest run of settled records; the reader hands out the
        rest again (a concurrent lane may have settled some of them: at least once)."""
        with self._lock:
            done = self._done.pop(shard_id, set())
        for record in records:
            number = record["dynamodb"]["SequenceNumber"]
            if number not in done:
                self.reader.rewind(shard_id, number)
                return
            self.settled[shard_id] = number

    def _retry_or_fail(
        self, shard_id: str, records: list[dict[str, Any]], attempt: int, error: str | None
    ) -> None:
        limit = self.settings.max_retries
        if limit < 0 or attempt < limit:
            with self._lock:
                self.report.retries += 1
            time.sleep(min(1.0, 0.05 * 2**attempt))
            self._deliver(shard_id, records, attempt + 1)
            return
        message = _failure_message(shard_id, records, self.reader.stream_arn, attempt + 1, error)
        self.sqs.send_message(QueueUrl=self.failure_queue_url, MessageBody=json.dumps(message))
        with self._lock:
            self.report.sent_to_failure_queue += len(records)
            self.report.failure_messages.append(message)
            self._done.setdefault(shard_id, set()).update(
                r["dynamodb"]["SequenceNumber"] for r in records
            )
        self.say(
            f"pump: {len(records)} records sent to the on-failure queue after {attempt + 1} tries"
        )

    def _rewind(self, shards: list[tuple[str, list[dict[str, Any]]]]) -> None:
        """Make the reader hand out again every record of ``shards`` (read, not delivered)."""
        for shard_id, records in shards:
            if records:
                self.reader.rewind(shard_id, records[0]["dynamodb"]["SequenceNumber"])

    def _save(self) -> None:
        if self.checkpoint is not None and self.settled != self._saved:
            self.checkpoint.save(self.settled)
            self._saved = dict(self.settled)

    # --- the recheck queue -------------------------------------------------------------

    def _rechecks(self) -> int:
        delivered = 0
        while True:
            if self.stop_signal:
                raise PumpStopped
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


def lane_of(record: Mapping[str, Any], factor: int) -> int:
    """The lane (0 to factor - 1) of a record's item: a stable hash of its whole key."""
    if factor == 1:
        return 0
    keys = json.dumps(record["dynamodb"]["Keys"], sort_keys=True).encode()
    return int.from_bytes(hashlib.blake2b(keys, digest_size=4).digest(), "big") % factor


def _failure_message(
    shard_id: str, records: list[dict[str, Any]], stream_arn: str, invokes: int, error: str | None
) -> dict[str, Any]:
    """The record Lambda sends to an on-failure destination for a stream batch."""
    first, last = records[0]["dynamodb"], records[-1]["dynamodb"]
    context: dict[str, Any] = {"statusCode": 200, "executedVersion": "$LATEST"}
    if error:
        context["functionError"] = error
    return {
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "functionArn": "arn:aws:lambda:us-east-1:000000000000:function:tally-local-reconciler",
            "condition": "RetryAttemptsExhausted",
            "approximateInvokeCount": invokes,
        },
        "responseContext": context,
        "version": "1.0",
        "timestamp": iso(datetime.now(UTC)),
        "DDBStreamBatchInfo": {
            "shardId": shard_id,
            "startSequenceNumber": first["SequenceNumber"],
            "endSequenceNumber": last["SequenceNumber"],
            "approximateArrivalOfFirstRecord": _iso(first.get("ApproximateCreationDateTime")),
            "approximateArrivalOfLastRecord": _iso(last.get("ApproximateCreationDateTime")),
            "batchSize": len(records),
            "streamArn": stream_arn,
        },
    }


def _iso(epoch: Any) -> str | None:
    if epoch is None:
        return None
    return epoch_iso(float(epoch))
