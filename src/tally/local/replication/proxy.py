"""One Region's DynamoDB endpoint: an HTTP front to that Region's DynamoDB Local.

Programs (boto3, the AWS CLI, any SDK, the reconciler) talk to it as to DynamoDB. On the way
in, each write to a replicated table is stamped (``wire.stamp_request``) while its keys are
held, so a Region's stamps follow the order its writes commit; a deletion's tombstone is
written before the keys are let go. On the way out the hidden stamp is taken out of every
answer and stream record. In the strongly consistent profile (MRSC) every Region's front
talks to one database; a transaction touching a replicated table and its TTL are refused,
and a write to an item another Region wrote within the conflict window is refused with
``ReplicatedWriteConflictException``.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import urllib3
from botocore.exceptions import ClientError

from tally.local.replication.clocks import KeyLocks, RegionClock
from tally.local.replication.wire import (
    Refused,
    WireKey,
    WireStamp,
    hides_tables,
    key_attributes,
    stamp_request,
    tombstones_of,
    transaction_touches,
    visible_records,
    wire_key,
    without_hidden,
)

WRITES = {
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "BatchWriteItem",
    "TransactWriteItems",
    "ExecuteStatement",
    "BatchExecuteStatement",
    "ExecuteTransaction",
}
TRANSACTIONS = {"TransactWriteItems", "TransactGetItems", "ExecuteTransaction"}
_JSON = "application/x-amz-json-1.0"


class KeySchemas:
    """Each table's key attribute names, read once from the Region's database."""

    def __init__(self, backend: Any):
        self._backend = backend
        self._known: dict[str, list[str]] = {}

    def key(self, table: str, item: Mapping[str, Any]) -> WireKey | None:
        names = self._known.get(table)
        if names is None:
            try:
                schema = self._backend.describe_table(TableName=table)["Table"]["KeySchema"]
            except ClientError:
                return None
            names = self._known[table] = [k["AttributeName"] for k in schema]
        if not all(n in item for n in names):
            return None
        return wire_key({n: item[n] for n in names})

    def forget(self, table: str) -> None:
        self._known.pop(table, None)


def written_keys(
    operation: str, body: Mapping[str, Any], tables: set[str], schemas: KeySchemas
) -> list[tuple[str, WireKey]]:
    """The (table, key) of every item of a replicated table the request writes or checks."""
    found: list[tuple[str, WireKey | None]] = []
    if operation == "PutItem":
        table = body.get("TableName", "")
        found.append((table, schemas.key(table, body.get("Item", {}))))
    elif operation in ("UpdateItem", "DeleteItem"):
        found.append((body.get("TableName", ""), wire_key(body.get("Key", {}))))
    elif operation == "BatchWriteItem":
        for table, requests in body.get("RequestItems", {}).items():
            for request in requests:
                if "PutRequest" in request:
                    found.append((table, schemas.key(table, request["PutRequest"]["Item"])))
                elif "DeleteRequest" in request:
                    found.append((table, wire_key(request["DeleteRequest"]["Key"])))
    elif operation == "TransactWriteItems":
        for action in body.get("TransactItems", []):
            for kind, detail in action.items():
                table = detail.get("TableName", "")
                if kind == "Put":
                    found.append((table, schemas.key(table, detail.get("Item", {}))))
                else:
                    found.append((table, wire_key(detail.get("Key", {}))))
    return [(t, k) for t, k in found if t in tables and k is not None]


class ConflictWindow:
    """MRSC: which Region is writing each item, and until when another Region's write to it
    counts as racing it (while the write is in flight, and ``seconds`` after it answered: the
    time its replication to the other Regions takes; inferred)."""

    def __init__(self, seconds: float, now: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self._now = now
        self._writers: dict[tuple[str, WireKey], tuple[str, float]] = {}
        self._lock = threading.Lock()

    def claim(self, region: str, keys: Iterable[tuple[str, WireKey]]) -> bool:
        """Mark the keys as written from ``region`` now; False if another Region's write to
        one of them is in flight or within its window."""
        keys = list(keys)
        with self._lock:
            now = self._now()
            for key in keys:
                writer = self._writers.get(key)
                if writer is not None and writer[0] != region and writer[1] > now:
                    return False
            for key in keys:
                self._writers[key] = (region, float("inf"))
            return True

    def release(self, region: str, keys: Iterable[tuple[str, WireKey]]) -> None:
        with self._lock:
            until = self._now() + self.seconds
            for key in keys:
                if self._writers.get(key, (None,))[0] == region:
                    self._writers[key] = (region, until)


class TokenStamps:
    """The stamp a ``TransactWriteItems`` got under its ``ClientRequestToken``, for the
    token's ten minutes (AWS's idempotency window): an SDK's retry after a lost response
    sends the same request, and must reach DynamoDB Local with the same hidden stamp, or it
    would be other parameters under one token (``IdempotentParameterMismatchException``)."""

    SECONDS = 600.0
    MOST = 100_000

    def __init__(self, now: Callable[[], float] = time.monotonic):
        self._now = now
        self._stamps: dict[str, tuple[WireStamp, float]] = {}
        self._lock = threading.Lock()

    def get(self, token: object) -> WireStamp | None:
        with self._lock:
            held = self._stamps.get(token) if isinstance(token, str) else None
            return held[0] if held is not None and held[1] > self._now() else None

    def keep(self, token: object, stamp: WireStamp) -> None:
        if not isinstance(token, str):
            return
        with self._lock:
            now = self._now()
            if len(self._stamps) >= self.MOST:
                self._stamps = {t: h for t, h in self._stamps.items() if h[1] > now}
                if len(self._stamps) >= self.MOST:  # all live: the oldest goes
                    self._stamps.pop(next(iter(self._stamps)))
            if token not in self._stamps or self._stamps[token][1] <= now:
                self._stamps[token] = (stamp, now + self.SECONDS)  # a replay keeps the first


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def error(code: str, message: str) -> Answer:
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": message})
    return Answer(400, {"Content-Type": _JSON}, body.encode())


class RegionFront:
    """What one Region's endpoint does to a request, the HTTP server aside."""

    def __init__(
        self,
        region: str,
        backend_url: str,
        backend: Any,
        replicated: Iterable[str],
        clock: RegionClock,
        locks: KeyLocks,
        conflicts: ConflictWindow | None = None,
        control: Callable[[str, str, dict[str, Any]], Any] | None = None,
        created: Callable[[], None] = lambda: None,
        regions: Iterable[str] = (),
    ):
        self.region = region
        self._url = backend_url.rstrip("/")
        self._backend = backend
        self.replicated = set(replicated)
        self._clock = clock
        self._locks = locks
        self._conflicts = conflicts
        self._control = control
        self._created = created
        self.regions = list(regions)
        self._tokens = TokenStamps()
        self._schemas = KeySchemas(backend)
        self._http = urllib3.PoolManager(maxsize=32, retries=False)

    def handle(self, method: str, path: str, headers: Mapping[str, str], raw: bytes) -> Answer:
        if path.startswith("/__emulator/"):
            return self._controlled(method, path, raw)
        target = headers.get("X-Amz-Target", "")
        operation = target.rpartition(".")[2]
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return self._forward(headers, raw)  # DynamoDB Local answers what it cannot read
        if operation in ("CreateTable", "DeleteTable"):
            self._schemas.forget(body.get("TableName", ""))
        strong = self._conflicts is not None
        try:
            if strong:
                self._refuse_in_strong_mode(operation, body)
            if operation not in WRITES:
                answer = self._forward(headers, raw)
                created = operation == "CreateTable" and answer.status == 200
                if created and body.get("TableName") in self.replicated:
                    self._created()  # its tombstones exist before its first delete
                return self._shown(operation, answer)
            keys = written_keys(operation, body, self.replicated, self._schemas)
            if strong:
                assert self._conflicts is not None
                if keys and not self._conflicts.claim(self.region, keys):
                    return error(
                        "ReplicatedWriteConflictException",
                        "One or more items in this request are being modified by a request "
                        "in another Region.",
                    )
                try:
                    return self._shown(operation, self._forward(headers, raw))
                finally:
                    self._conflicts.release(self.region, keys)
            with self._locks.hold(self.region, keys):
                token = (
                    body.get("ClientRequestToken") if operation == "TransactWriteItems" else None
                )
                stamp = self._tokens.get(token) or WireStamp(self._clock.next(), self.region)
                stamped = stamp_request(operation, body, stamp, self.replicated)
                answer = self._forward(headers, json.dumps(stamped.body).encode())
                if answer.status == 200:
                    self._tokens.keep(token, stamp)
                if answer.status == 200 and stamped.deletions:
                    self._bury(answer, stamped.deletions, stamp)
                return self._shown(operation, answer)
        except Refused as refused:
            return error(refused.code, str(refused))

    def _refuse_in_strong_mode(self, operation: str, body: Mapping[str, Any]) -> None:
        # AWS refuses transactions on an MRSC table; one on regional tables only runs.
        if operation in TRANSACTIONS and transaction_touches(operation, body, self.replicated):
            raise Refused(
                "ValidationException",
                "Transactions are not supported on a multi-Region strongly consistent (MRSC) "
                "global table",
            )
        if operation == "UpdateTimeToLive" and body.get("TableName") in self.replicated:
            raise Refused(
                "ValidationException",
                "Time to Live is not supported on a multi-Region strongly consistent (MRSC) "
                "global table",
            )

    def _bury(self, answer: Answer, deletions: Iterable[Any], stamp: WireStamp) -> None:
        """Write the tombstones of deletions that happened (not those left unprocessed)."""
        unprocessed = set()
        for table, requests in json.loads(answer.body or b"{}").get("UnprocessedItems", {}).items():
            for request in requests:
                if "DeleteRequest" in request:
                    unprocessed.add((table, wire_key(request["DeleteRequest"]["Key"])))
        for deletion in deletions:
            if (deletion.table, deletion.key) in unprocessed:
                continue
            key = key_attributes(deletion.key)
            self._backend.put_item(
                TableName=tombstones_of(deletion.table), Item={**key, **stamp.attributes()}
            )

    def _forward(self, headers: Mapping[str, str], raw: bytes) -> Answer:
        sent = {
            k: v
            for k, v in headers.items()
            if k.lower() not in ("host", "content-length", "accept-encoding", "connection")
        }
        response = self._http.request("POST", self._url + "/", body=raw, headers=sent)
        kept = {
            k: v
            for k, v in response.headers.items()
            if k.lower()
            not in ("content-length", "transfer-encoding", "connection", "server", "date")
        }
        return Answer(response.status, kept, response.data)

    def _shown(self, operation: str, answer: Answer) -> Answer:
        """The answer without the hidden stamp (and the side tables), its checksum redone."""
        try:
            body = json.loads(answer.body) if answer.body else None
        except ValueError:
            return answer
        if not isinstance(body, dict):
            return answer
        if operation == "GetRecords" and "Records" in body:
            body["Records"] = visible_records(body["Records"], self.region)
        elif operation == "ListTables" and "TableNames" in body:
            body["TableNames"] = hides_tables(body["TableNames"])
        elif operation == "DescribeTable" and body.get("Table", {}).get("TableName") in (
            self.replicated
        ):
            # As AWS describes a replica: the other Regions', and the global table's version.
            body["Table"]["Replicas"] = [
                {"RegionName": r, "ReplicaStatus": "ACTIVE"}
                for r in self.regions
                if r != self.region
            ]
            body["Table"]["GlobalTableVersion"] = "2019.11.21"
            if self._conflicts is not None:
                body["Table"]["MultiRegionConsistency"] = "STRONG"
        raw = json.dumps(without_hidden(body)).encode()
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "x-amz-crc32"}
        headers["x-amz-crc32"] = str(zlib.crc32(raw) & 0xFFFFFFFF)
        return Answer(answer.status, headers, raw)

    def _controlled(self, method: str, path: str, raw: bytes) -> Answer:
        if self._control is None:
            return Answer(404, {}, b"")
        try:
            given = json.loads(raw) if raw else {}
            result = self._control(method, path.removeprefix("/__emulator/"), given)
        except (LookupError, ValueError) as exc:
            result, status = {"error": str(exc)}, 400
        else:
            status = 200
        return Answer(status, {"Content-Type": "application/json"}, json.dumps(result).encode())


class _Handler(BaseHTTPRequestHandler):
    front: RegionFront
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer = self.server.front.handle(  # type: ignore[attr-defined]
            self.command, self.path, dict(self.headers.items()), raw
        )
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    do_POST = _serve
    do_GET = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


class RegionServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, front: RegionFront, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _Handler)
        self.front = front
        self._thread = threading.Thread(
            target=self.serve_forever, name=f"region-{front.region}", daemon=True
        )

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
