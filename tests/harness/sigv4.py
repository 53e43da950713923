"""A stand-in for an IAM-authorized API Gateway endpoint: a local HTTP server (stdlib, its
own thread) that keeps every request it is sent, and a check of a kept request's SigV4
signature recomputed with botocore's own signer, as API Gateway checks it."""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<scope>[^,]+), "
    r"SignedHeaders=(?P<signed>[^,]+), Signature=(?P<signature>[0-9a-f]{64})$"
)


@dataclass(frozen=True)
class Captured:
    """One request as the server read it off the wire."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        found = [value for key, value in self.headers if key.lower() == name.lower()]
        assert len(found) <= 1, f"{name} sent {len(found)} times"
        return found[0] if found else None


@dataclass
class Endpoint:
    """The server's address, what it answers, and what it was sent."""

    url: str
    status: int = 201
    answer: bytes = b'{"outcome": "created", "replayed": false}'
    sent: list[Captured] = field(default_factory=list)


@contextmanager
def endpoint() -> Iterator[Endpoint]:
    """A server on a free local port, answering every request ``status`` and ``answer``."""
    served: list[Endpoint] = []

    class Handler(BaseHTTPRequestHandler):
        def _capture(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            captured = Captured(self.command, self.path, tuple(self.headers.items()), body)
            served[0].sent.append(captured)
            self.send_response(served[0].status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(served[0].answer)))
            self.end_headers()
            self.wfile.write(served[0].answer)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _capture

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served.append(Endpoint(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def signature_holds(
    request: Captured, credentials: Credentials, region: str, service: str = "execute-api"
) -> bool:
    """Whether ``request`` carries a SigV4 signature of exactly its method, path, signed
    headers and body, by ``credentials`` for ``service`` in ``region``."""
    authorization = AUTHORIZATION.match(request.header("Authorization") or "")
    timestamp = request.header("X-Amz-Date")
    if authorization is None or timestamp is None:
        return False
    if authorization["key"] != credentials.access_key:
        return False
    signed_names = authorization["signed"].split(";")
    if "host" not in signed_names or "x-amz-date" not in signed_names:
        return False
    signed = {name: request.header(name) for name in signed_names}
    if any(value is None for value in signed.values()):
        return False
    # botocore takes a payload hash header on trust; API Gateway checks it against the body.
    claimed = signed.get("x-amz-content-sha256")
    if claimed is not None and claimed != hashlib.sha256(request.body).hexdigest():
        return False
    host = signed["host"]
    rebuilt = AWSRequest(request.method, f"http://{host}{request.path}", signed, request.body)
    rebuilt.context["timestamp"] = timestamp
    signer = SigV4Auth(credentials, service, region)
    if signer.scope(rebuilt).split("/", 1)[1] != authorization["scope"]:
        return False
    canonical = signer.canonical_request(rebuilt)
    expected = signer.signature(signer.string_to_sign(rebuilt, canonical), rebuilt)
    return hmac.compare_digest(expected, authorization["signature"])
