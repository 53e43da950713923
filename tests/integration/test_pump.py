"""The pump plays Lambda's event source mapping on DynamoDB Local's real stream."""

from __future__ import annotations

import json
import signal
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from botocore.config import Config
from moto.server import ThreadedMotoServer

from tally.cli import app as cli
from tally.core.streams import StreamReader, stream_arn
from tally.handlers import recheck as recheck_handler
from tally.handlers import reconciler as reconciler_handler
from tally.local.checkpoint import Checkpoint
from tally.local.dynamodb_local import local_client_kwargs
from tally.local.pump import QUIET_POLLS, Pump
from tally.local.sqs_trigger import Invoke
from tally.local.stream_trigger import MappingSettings, lane_of
from tally.reconciler import runtime
from tally.reconciler.report.rechecks import Recheck, RecheckQueue
from tests.harness.live import watched_schedule
from tests.integration.conftest import Stack
from tests.utils import lambda_context, serialize


class Handler:
    """A stand-in reconciler that records what it was given and fails on request."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.sequence_numbers: dict[str, str] = {}
        self.poison: set[str] = set()  # keys whose presence makes the function raise
        self.report_once: set[str] = set()  # keys reported as failed the first time
        self.report_always: set[str] = set()  # keys reported as failed every time
        self.during: dict[int, Callable[[], None]] = {}  # invocation number -> done inside it

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        keys = [r["dynamodb"]["Keys"]["SK"]["S"] for r in event["Records"]]
        for key, record in zip(keys, event["Records"], strict=True):
            self.sequence_numbers[key] = record["dynamodb"]["SequenceNumber"]
        self.batches.append(keys)
        self.during.pop(len(self.batches), lambda: None)()
        if self.poison & set(keys):
            raise RuntimeError("poison record")
        failed = [
            r["dynamodb"]["SequenceNumber"]
            for r in event["Records"]
            if r["dynamodb"]["Keys"]["SK"]["S"] in self.report_once | self.report_always
        ]
        self.report_once -= set(keys)
        return {"batchItemFailures": [{"itemIdentifier": n} for n in failed]}

    def delivered(self) -> list[str]:
        return [key for batch in self.batches for key in batch]


@pytest.fixture
def queues(moto_endpoint: str) -> Iterator[tuple[Any, str, str]]:
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    recheck = sqs.create_queue(QueueName="pump-rechecks")["QueueUrl"]
    failures = sqs.create_queue(QueueName="pump-failures")["QueueUrl"]
    yield sqs, recheck, failures
    for url in (recheck, failures):
        sqs.delete_queue(QueueUrl=url)


def make_pump(
    dynamodb: Any,
    endpoint: str,
    table: str,
    queues: tuple[Any, str, str],
    handler: Handler,
    rechecks: list[dict[str, Any]] | None = None,
    *,
    recheck_handler: Invoke | None = None,
    checkpoint: Checkpoint | None = None,
    say: Callable[[str], None] | None = None,
    rechecks_beside: bool = False,
    recheck_lanes: int = 1,
    **settings: Any,
) -> Pump:
    streams = boto3.client("dynamodbstreams", **local_client_kwargs(endpoint))
    sqs, recheck, failures = queues
    received = rechecks if rechecks is not None else []

    def accept_all(event: dict[str, Any]) -> dict[str, Any]:
        received.extend(event["Records"])
        return {"batchItemFailures": []}

    reader = StreamReader(streams, stream_arn(dynamodb, table))
    if checkpoint is not None:
        reader.resume(checkpoint.load())
    return Pump(
        reader,
        handler,
        recheck_handler or accept_all,
        sqs,
        recheck,
        failures,
        MappingSettings(**({"batch_size": 10, "max_retries": 2, "bisect": True} | settings)),
        say,
        checkpoint,
        rechecks_beside=rechecks_beside,
        recheck_lanes=recheck_lanes,
    )


class Meeting:
    """Handlers that each wait for the others: only ``n`` invocations running at once get
    past the barrier (15 s at most); ``finished`` once ``n`` have met."""

    def __init__(self, n: int):
        self.n, self.barrier = n, threading.Barrier(n, timeout=15)
        self.met: list[str] = []
        self.finished = threading.Event()
        self._lock = threading.Lock()

    def meet(self, *names: str) -> dict[str, Any]:
        self.barrier.wait()
        with self._lock:
            self.met.extend(names)
            if len(self.met) >= self.n:
                self.finished.set()
        return {"batchItemFailures": []}


def serve_until(pump: Pump, finished: threading.Event) -> None:
    """Run the pump with its lanes until ``finished`` (40 s at most), then stop it."""
    running = threading.Thread(target=pump.forever)
    running.start()
    try:
        finished.wait(timeout=40)
    finally:
        pump.stop(signal.SIGINT)
        running.join(timeout=60)
    assert not running.is_alive()


def write(dynamodb: Any, table: str, count: int) -> list[str]:
    keys = [f"ITEM#{n:03d}" for n in range(count)]
    for key in keys:
        dynamodb.put_item(TableName=table, Item=serialize({"PK": "P", "SK": key}))
    return keys


def test_records_arrive_once_in_order_in_batches_of_the_batch_size(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    keys = write(dynamodb, table_name, 25)
    handler = Handler()
    make_pump(dynamodb, dynamodb_endpoint, table_name, queues, handler).until_idle()
    assert handler.delivered() == keys
    assert max(len(batch) for batch in handler.batches) == 10


def test_a_partial_failure_is_retried_from_the_first_failed_record(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    keys = write(dynamodb, table_name, 10)
    handler = Handler()
    handler.report_once = {"ITEM#004"}
    pump = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, handler)
    report = pump.until_idle()
    assert handler.batches == [keys, keys[4:]]
    assert report.retries == 1 and report.sent_to_failure_queue == 0


def test_a_function_error_bisects_and_parks_only_the_poison_record(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    keys = write(dynamodb, table_name, 8)
    handler = Handler()
    handler.poison = {"ITEM#005"}
    report = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, handler).until_idle()
    succeeded = [k for batch in handler.batches if "ITEM#005" not in batch for k in batch]
    assert sorted(succeeded) == [k for k in keys if k != "ITEM#005"]
    assert report.bisections >= 3 and report.sent_to_failure_queue == 1
    sqs, _, failures = queues
    [message] = sqs.receive_message(QueueUrl=failures, MaxNumberOfMessages=10)["Messages"]
    info = json.loads(message["Body"])["DDBStreamBatchInfo"]
    assert info["batchSize"] == 1
    assert info["startSequenceNumber"] == info["endSequenceNumber"]
    assert info["streamArn"] == stream_arn(dynamodb, table_name)
    assert json.loads(message["Body"])["requestContext"]["condition"] == "RetryAttemptsExhausted"


def test_without_bisection_the_whole_batch_is_parked_after_the_retry_limit(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    write(dynamodb, table_name, 4)
    handler = Handler()
    handler.poison = {"ITEM#002"}
    pump = make_pump(
        dynamodb, dynamodb_endpoint, table_name, queues, handler, bisect=False, max_retries=1
    )
    report = pump.until_idle()
    assert len(handler.batches) == 2  # the first try and one retry
    assert report.sent_to_failure_queue == 4


def test_due_rechecks_are_delivered_and_delayed_ones_counted_as_pending(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    sqs, recheck, _ = queues
    sqs.send_message(QueueUrl=recheck, MessageBody='{"due": true}')
    sqs.send_message(QueueUrl=recheck, MessageBody='{"due": false}', DelaySeconds=600)
    received: list[dict[str, Any]] = []
    pump = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, Handler(), received)
    report = pump.until_idle()
    assert [json.loads(r["body"]) for r in received] == [{"due": True}]
    assert report.rechecks == 1 and report.pending_rechecks == 1


def test_a_second_pump_resumes_after_the_first_ones_checkpoint(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    write(dynamodb, table_name, 3)
    first = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, Handler())
    first.until_idle()
    dynamodb.put_item(TableName=table_name, Item=serialize({"PK": "P", "SK": "LATE"}))
    handler = Handler()
    second = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, handler)
    second.reader.resume(first.reader.positions())
    second.until_idle()
    assert handler.delivered() == ["LATE"]


# --- checkpoints -----------------------------------------------------------------------------


def test_the_checkpoint_stops_before_the_first_failed_record(
    dynamodb: Any,
    dynamodb_endpoint: str,
    table_name: str,
    queues: tuple[Any, str, str],
    tmp_path: Path,
) -> None:
    keys = write(dynamodb, table_name, 10)
    handler = Handler()
    handler.report_always = {"ITEM#004"}
    checkpoint = Checkpoint(tmp_path / "checkpoint.json", stream_arn(dynamodb, table_name))
    pump = make_pump(
        dynamodb, dynamodb_endpoint, table_name, queues, handler, checkpoint=checkpoint
    )
    # Stop asked while the first invocation runs: it finishes, its retry never starts.
    handler.during[1] = lambda: pump.stop(signal.SIGINT)
    report = pump.until_idle()
    assert handler.batches == [keys]
    assert not report.idle and report.records == 4
    [(shard, position)] = checkpoint.load().items()
    assert position == handler.sequence_numbers["ITEM#003"] == pump.positions()[shard]

    # The next pump starts at the failed record.
    after = Handler()
    make_pump(
        dynamodb, dynamodb_endpoint, table_name, queues, after, checkpoint=checkpoint
    ).until_idle()
    assert after.delivered() == keys[4:]


def test_an_unreadable_checkpoint_means_reading_the_stream_again_from_its_start(
    dynamodb: Any,
    dynamodb_endpoint: str,
    table_name: str,
    queues: tuple[Any, str, str],
    tmp_path: Path,
) -> None:
    keys = write(dynamodb, table_name, 5)
    path, stream = tmp_path / "checkpoint.json", stream_arn(dynamodb, table_name)
    make_pump(
        dynamodb,
        dynamodb_endpoint,
        table_name,
        queues,
        Handler(),
        checkpoint=Checkpoint(path, stream),
    ).until_idle()
    path.write_bytes(path.read_bytes()[:-5])  # as a crash mid-write once left it
    said: list[str] = []
    handler = Handler()
    pump = make_pump(
        dynamodb,
        dynamodb_endpoint,
        table_name,
        queues,
        handler,
        checkpoint=Checkpoint(path, stream, said.append),
    )
    assert pump.until_idle().idle
    assert handler.delivered() == keys
    assert "trim horizon" in said[0]
    assert Checkpoint(path, stream).load() == pump.positions()


# --- the recheck queue -----------------------------------------------------------------------


def failing_rechecks(failures: int, handled: list[str]) -> Invoke:
    """A recheck handler built as ours is (Powertools' BatchProcessor), whose every record
    fails its first ``failures`` deliveries: Powertools then raises BatchProcessingError."""
    processor = BatchProcessor(event_type=EventType.SQS)
    tries: Counter[str] = Counter()

    def record_handler(record: SQSRecord) -> None:
        tries[record.message_id] += 1
        if tries[record.message_id] <= failures:
            raise RuntimeError("the table did not answer")
        handled.append(record.body)

    def handler(event: dict[str, Any]) -> Any:
        return process_partial_response(
            event=event,
            record_handler=record_handler,
            processor=processor,
            context=lambda_context(),
        )

    return handler


def test_a_recheck_batch_that_fails_whole_comes_back_and_the_pump_goes_on(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    sqs, recheck, _ = queues
    bodies = [f"recheck {n}" for n in range(3)]
    for body in bodies:
        sqs.send_message(QueueUrl=recheck, MessageBody=body)
    keys = write(dynamodb, table_name, 5)
    handled: list[str] = []
    said: list[str] = []
    handler = Handler()
    pump = make_pump(
        dynamodb,
        dynamodb_endpoint,
        table_name,
        queues,
        handler,
        recheck_handler=failing_rechecks(1, handled),
        say=said.append,
    )
    pump.rechecks.visibility_seconds = 1  # instead of 30 s, so they come back soon

    pump.step()
    assert handler.delivered() == keys
    assert (pump.report.failed_rechecks, pump.report.rechecks, handled) == (3, 0, [])
    assert any("BatchProcessingError" in line for line in said)

    # Visible again after their timeout, as SQS makes them: delivered, and this time handled.
    report = pump.until_idle(rechecks=True)
    assert report.idle and report.pending_rechecks == 0
    assert sorted(handled) == bodies and report.rechecks == 3


class ShortPollingSQS:
    """SQS as short polling may answer: the first receives sample no server holding a message."""

    def __init__(self, sqs: Any, empty_receives: int) -> None:
        self.sqs = sqs
        self.empty_receives = empty_receives

    def receive_message(self, **request: Any) -> dict[str, Any]:
        if self.empty_receives:
            self.empty_receives -= 1
            return {}
        response: dict[str, Any] = self.sqs.receive_message(**request)
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sqs, name)


def test_a_due_recheck_not_yet_received_keeps_the_pump_from_idling(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    sqs, recheck, failures = queues
    sqs.send_message(QueueUrl=recheck, MessageBody='{"due": true}')
    received: list[dict[str, Any]] = []
    missing = (ShortPollingSQS(sqs, empty_receives=QUIET_POLLS + 2), recheck, failures)
    report = make_pump(
        dynamodb, dynamodb_endpoint, table_name, missing, Handler(), received
    ).until_idle()
    assert [json.loads(r["body"]) for r in received] == [{"due": True}]
    assert report.idle and report.rechecks == 1 and report.pending_rechecks == 0


def test_waiting_for_rechecks_runs_the_delayed_ones_once_due(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    sqs, recheck, _ = queues
    sqs.send_message(QueueUrl=recheck, MessageBody='{"due": "later"}', DelaySeconds=1)
    received: list[dict[str, Any]] = []
    pump = make_pump(dynamodb, dynamodb_endpoint, table_name, queues, Handler(), received)
    report = pump.until_idle(rechecks=True)
    assert [json.loads(r["body"]) for r in received] == [{"due": "later"}]
    assert report.idle and report.pending_rechecks == 0


# --- outages ---------------------------------------------------------------------------------


class Moto:
    """A moto server on a fixed loopback port that can go down and come back (state is kept)."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server: ThreadedMotoServer | None = None
        self.up()

    def up(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def down(self) -> None:
        assert self.server is not None and self.server._server is not None
        self.server.stop()
        self.server._server.server_close()  # refuse connections, as a stopped service does
        self.server = None


@pytest.fixture
def moto() -> Iterator[Moto]:
    server = Moto()
    yield server
    if server.server is not None:
        server.down()


def test_sqs_down_for_a_while_stops_nothing_and_loses_nothing(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, moto: Moto
) -> None:
    # One try per call: the pump, not botocore, waits the outage out.
    sqs = boto3.client(
        "sqs",
        endpoint_url=moto.endpoint,
        region_name="us-east-1",
        config=Config(retries={"total_max_attempts": 1}),
    )
    suffix = uuid.uuid4().hex[:8]
    recheck = sqs.create_queue(QueueName=f"outage-rechecks-{suffix}")["QueueUrl"]
    failures = sqs.create_queue(QueueName=f"outage-failures-{suffix}")["QueueUrl"]
    sqs.send_message(QueueUrl=recheck, MessageBody='{"during": "outage"}')
    keys = write(dynamodb, table_name, 6)
    handler = Handler()
    handler.poison = {"ITEM#003"}  # bound for the on-failure queue, itself on SQS
    received: list[dict[str, Any]] = []
    pump = make_pump(
        dynamodb,
        dynamodb_endpoint,
        table_name,
        (sqs, recheck, failures),
        handler,
        received,
        max_retries=0,
    )

    moto.down()
    for _ in range(3):
        pump.step()  # raises nothing
    assert pump.report.outages >= 3
    # Nothing past the record that could not be parked is settled.
    assert list(pump.positions().values()) == [handler.sequence_numbers["ITEM#002"]]

    moto.up()
    report = pump.until_idle()
    assert report.idle
    assert set(handler.delivered()) == set(keys)
    assert list(pump.positions().values()) == [handler.sequence_numbers["ITEM#005"]]
    [parked] = sqs.receive_message(QueueUrl=failures, MaxNumberOfMessages=10)["Messages"]
    info = json.loads(parked["Body"])["DDBStreamBatchInfo"]
    assert info["startSequenceNumber"] == handler.sequence_numbers["ITEM#003"]
    assert info["batchSize"] == 1
    assert [json.loads(r["body"]) for r in received] == [{"during": "outage"}]


# --- ParallelizationFactor -------------------------------------------------------------------


def keys_in_lanes(factor: int, wanted: int) -> list[str]:
    """Sort keys of one item collection (PK "P") whose items fall in ``wanted`` distinct lanes."""
    chosen: dict[int, str] = {}
    for n in range(1000):
        sk = f"ITEM#{n:03d}"
        lane = lane_of({"dynamodb": {"Keys": {"PK": {"S": "P"}, "SK": {"S": sk}}}}, factor)
        chosen.setdefault(lane, sk)
        if len(chosen) == wanted:
            return list(chosen.values())
    raise AssertionError("not enough lanes")


def test_the_factor_and_the_mapping_settings_come_from_the_template(
    template: dict[str, Any],
) -> None:
    settings = MappingSettings.from_template(template)
    # No batching window: a record is delivered as the poll finds it, not up to a second later.
    assert (settings.batch_size, settings.window_seconds, settings.parallelization) == (100, 0, 1)
    assert (
        MappingSettings.from_event(
            {"MaximumBatchingWindowInSeconds": {"Ref": "StreamBatchingWindow"}},
            {"StreamBatchingWindow": "2"},
        ).window_seconds
        == 2
    )
    assert (settings.max_retries, settings.bisect, settings.partial_responses) == (5, True, True)
    assert MappingSettings.from_template(template, parallelization=10).parallelization == 10
    with pytest.raises(ValueError, match="ParallelizationFactor must be 1 to 10, not 11"):
        MappingSettings.from_template(template, parallelization=11)


def test_one_items_records_stay_in_order_across_concurrent_batches(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    items = keys_in_lanes(4, 4)
    written: list[tuple[str, int]] = []
    for version in range(6):
        for sk in items:
            dynamodb.put_item(
                TableName=table_name, Item=serialize({"PK": "P", "SK": sk, "v": version})
            )
            written.append((sk, version))
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def handler(event: dict[str, Any]) -> dict[str, Any]:
        with lock:
            seen.extend(
                (r["dynamodb"]["Keys"]["SK"]["S"], int(r["dynamodb"]["NewImage"]["v"]["N"]))
                for r in event["Records"]
            )
        return {"batchItemFailures": []}

    pump = make_pump(
        dynamodb,
        dynamodb_endpoint,
        table_name,
        queues,
        handler,  # type: ignore[arg-type]
        batch_size=2,
        parallelization=4,
    )
    report = pump.until_idle()
    assert sorted(seen) == sorted(written)  # each record once
    for sk in items:
        assert [v for key, v in seen if key == sk] == list(range(6))
    assert report.batches == 12  # each lane's records in batches of two
    [position] = pump.positions().values()
    assert position == max(pump.reader.positions().values(), key=int)


def test_two_items_of_one_collection_are_verified_in_concurrent_batches(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    first, second = keys_in_lanes(2, 2)
    for sk in (first, second):
        dynamodb.put_item(TableName=table_name, Item=serialize({"PK": "P", "SK": sk}))
    # Each batch waits for the other: only two batches running at once get past the barrier.
    both = threading.Barrier(2, timeout=30)
    threads: set[str] = set()

    def handler(event: dict[str, Any]) -> dict[str, Any]:
        threads.add(threading.current_thread().name)
        both.wait()
        return {"batchItemFailures": []}

    report = make_pump(
        dynamodb,
        dynamodb_endpoint,
        table_name,
        queues,
        handler,  # type: ignore[arg-type]
        parallelization=2,
    ).until_idle()
    assert report.idle and report.records == 2 and report.batches == 2
    assert report.concurrent_batches == 2 and len(threads) == 2


# --- waiting for rechecks, through the real handlers -----------------------------------------


def stack_pump(stack: Stack, say: Callable[[str], None] | None = None) -> Pump:
    """A pump on the test stack's stream, invoking the real handlers in process."""
    failures = stack.sqs.create_queue(QueueName=f"failures-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    return Pump(
        stack.reader,
        lambda event: reconciler_handler.handler(event, lambda_context()),
        lambda event: recheck_handler.handler(event, lambda_context()),
        stack.sqs,
        stack.recheck_queue,
        failures,
        MappingSettings(batch_size=100),
        say,
        schedule=watched_schedule(),
    )


def test_until_idle_waits_for_a_carried_rogue_overwrite_to_be_recounted(stack: Stack) -> None:
    likes = 120  # a hot post: its unbalanced remainder is carried for the carry window
    requests = [
        {"PutRequest": {"Item": serialize({"PK": "POST#hot", "SK": f"LIKE#USER#{n:04d}"})}}
        for n in range(likes)
    ]
    for start in range(0, len(requests), 25):
        stack.dynamodb.batch_write_item(RequestItems={stack.table: requests[start : start + 25]})
    stack.put({"PK": "POST#hot", "SK": "META", "likeTally": likes, "tallyRevision": 1})
    stack.records()  # the seeding is not what is verified
    pump = stack_pump(stack)
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key=serialize({"PK": "POST#hot", "SK": "META"}),
        UpdateExpression="SET likeTally = likeTally + :n",
        ExpressionAttributeValues={":n": {"N": "7"}},
    )
    report = pump.until_idle(max_seconds=60)
    assert report.idle and report.rechecks >= 1 and report.pending_rechecks == 0
    [alert] = stack.alerts()  # after one pump, as `tally alerts` would show it
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", likes + 7, likes)


def test_until_settled_waits_out_a_longer_recheck_and_says_for_what(stack: Stack) -> None:
    said: list[str] = []
    pump = stack_pump(stack, said.append)
    delay = int(pump.carry_seconds) + 3  # beyond the carry window: --until-idle leaves it
    queue = RecheckQueue(runtime._clients()[2], stack.recheck_queue)
    queue.schedule(Recheck("likes", {"PK": "POST#later", "SK": "META"}, 0, "deferred"), delay)
    [waiting] = pump.schedule.waiting()
    assert (waiting.delay, waiting.rule, waiting.key) == (delay, "likes", "POST#later/META")

    first = pump.until_idle(max_seconds=60)
    assert first.idle and first.rechecks == 0 and first.pending_rechecks == 1

    settled = pump.until_idle(max_seconds=60, rechecks=True)
    assert settled.idle and settled.rechecks == 1 and settled.pending_rechecks == 0
    assert settled.waiting == ""
    [line] = [line for line in said if "waiting for" in line]
    due = datetime.fromtimestamp(waiting.due).strftime("%H:%M:%S")
    assert f"waiting for 1 recheck (deferred) until {due}" in line
    assert "deferred of likes POST#later/META" in line


@pytest.mark.parametrize("given", ["0", "11", "two"])
def test_a_factor_outside_1_to_10_is_a_usage_error(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        cli.main(["pump", "--until-idle", "--parallelization", given])
    assert exit.value.code == 2
    assert "--parallelization" in capsys.readouterr().err


def test_asked_to_the_recheck_queue_is_served_beside_a_stream_batch_in_flight(
    dynamodb: Any, dynamodb_endpoint: str, table_name: str, queues: tuple[Any, str, str]
) -> None:
    """As in Lambda, where the recheck function runs beside the stream function: a due
    recheck does not wait for a stream batch to finish, nor a stream batch for a recheck."""
    sqs, recheck, _ = queues
    write(dynamodb, table_name, 1)
    sqs.send_message(QueueUrl=recheck, MessageBody='{"due": true}')
    both = Meeting(2)
    pump = make_pump(
        dynamodb,
        dynamodb_endpoint,
        table_name,
        queues,
        lambda event: both.meet("stream"),  # type: ignore[arg-type]
        recheck_handler=lambda event: both.meet("recheck"),
        rechecks_beside=True,
    )
    serve_until(pump, both.finished)
    assert sorted(both.met) == ["recheck", "stream"]
    assert pump.report.records == 1 and pump.report.rechecks == 1


def test_rechecks_run_in_as_many_lanes_at_once_as_told_as_lambda_polls_a_queue(
    dynamodb: Any,
    dynamodb_endpoint: str,
    table_name: str,
    queues: tuple[Any, str, str],
) -> None:
    """Three recheck lanes: three batches of one recheck each are handled at once (each
    handler waits for the other two), and every recheck is handled once."""
    sqs, recheck, _ = queues
    for n in range(3):
        sqs.send_message(QueueUrl=recheck, MessageBody=f'{{"n": {n}}}')
    together = Meeting(3)
    pump = make_pump(
        dynamodb,
        dynamodb_endpoint,
        table_name,
        queues,
        Handler(),
        recheck_handler=lambda event: together.meet(*(r["body"] for r in event["Records"])),
        rechecks_beside=True,
        recheck_lanes=3,
    )
    pump.rechecks.batch_size = 1
    serve_until(pump, together.finished)
    assert sorted(together.met) == ['{"n": 0}', '{"n": 1}', '{"n": 2}']
    assert pump.report.rechecks == 3
    with pytest.raises(ValueError, match="recheck_lanes"):
        make_pump(dynamodb, dynamodb_endpoint, table_name, queues, Handler(), recheck_lanes=0)


class FullDisk(Checkpoint):
    def save(self, positions: dict[str, str]) -> None:
        raise OSError(28, "No space left on device")


def test_an_error_that_ends_one_lane_stops_both_and_is_raised(
    dynamodb: Any,
    dynamodb_endpoint: str,
    table_name: str,
    queues: tuple[Any, str, str],
    tmp_path: Path,
) -> None:
    """The stream lane cannot save its checkpoint: the recheck lane does not go on alone."""
    write(dynamodb, table_name, 1)
    checkpoint = FullDisk(tmp_path / "checkpoint.json", "arn:stream")
    pump = make_pump(
        dynamodb,
        dynamodb_endpoint,
        table_name,
        queues,
        Handler(),
        checkpoint=checkpoint,
        rechecks_beside=True,
    )
    raised: list[BaseException] = []

    def run() -> None:
        try:
            pump.forever()
        except BaseException as error:  # what forever() raised is the subject
            raised.append(error)

    running = threading.Thread(target=run)
    running.start()
    running.join(timeout=60)
    if running.is_alive():
        pump.stop(signal.SIGINT)
        running.join(timeout=60)
        pytest.fail("the pump went on with one lane after the other failed")
    assert [type(e) for e in raised] == [OSError]
    # The recheck lane ended before forever() raised: nothing serves the queue unseen.
    assert not [t for t in threading.enumerate() if t.name.startswith("pump-rechecks")]
