"""docs/writers.md's signed calls run as written: its Python and awscurl blocks, against a
local HTTP server standing in for the API, each request's SigV4 signature checked with
botocore's own signer. A block that cannot run here says why in an HTML comment right above
it (``<!-- not run by tests/integration/test_writers_doc.py: <reason> -->``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given
from hypothesis import strategies as st

from tests.harness.sigv4 import Captured, Endpoint, endpoint, signature_holds
from tests.integration.test_readme import ROOT, RUNNABLE, Block, blocks, run

DOC = ROOT / "docs" / "writers.md"
NOT_RUN = re.compile(r"<!-- not run by tests/integration/test_writers_doc\.py: (.+?) -->\s*$")
# AWS's documentation example keys: fixed, so a signature can be recomputed.
CREDENTIALS = Credentials(
    "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "FQoGZXIvYXdzEXAMPLETOKEN"
)
REGION = "eu-west-1"
SENT = {"key": {"PK": "POST#a91f", "SK": "LIKE#USER#7c20"}}


def page() -> list[Block]:
    return [b for b in blocks(DOC.read_text(), NOT_RUN) if b.language in RUNNABLE]


def the_block(language: str, containing: str) -> Block:
    [found] = [
        b
        for b in page()
        if b.language == language and containing in b.code and not b.skipped_because
    ]
    return found


def reader_env(tmp_path: Path, api: Endpoint) -> dict[str, str]:
    """A reader's shell after the doc's first block: the Region and the API's URL exported,
    credentials in the environment, no AWS config or proxy of the machine's own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AWS_") and k.lower() not in {"http_proxy", "https_proxy", "all_proxy"}
    }
    return env | {
        "AWS_ACCESS_KEY_ID": CREDENTIALS.access_key,
        "AWS_SECRET_ACCESS_KEY": CREDENTIALS.secret_key,
        "AWS_SESSION_TOKEN": CREDENTIALS.token,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1",
        "WRITER_API_URL": api.url,
        # `pip install awscurl` put it beside python, where the reader's PATH finds it.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def sent_by(block: Block, tmp_path: Path, status: int = 201, answer: bytes = b"") -> Captured:
    """The one request ``block`` sends to a local endpoint; the block must exit 0 and print
    the endpoint's answer."""
    with endpoint() as api:
        api.status, api.answer = status, answer or api.answer
        result = run(block, reader_env(tmp_path, api))
        assert result.returncode == 0, f"line {block.line}:\n{result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr, result.stderr
        assert api.answer.decode() in result.stdout, result.stdout
        [request] = api.sent
    return request


def assert_signed_and_exact(request: Captured) -> None:
    assert (request.method, request.path) == ("POST", "/children")
    assert json.loads(request.body) == SENT
    assert signature_holds(request, CREDENTIALS, REGION)
    # Anything changed after signing, or checked as another signer's, does not verify.
    other_key = Credentials(CREDENTIALS.access_key, "another-secret", CREDENTIALS.token)
    assert not signature_holds(request, other_key, REGION)
    assert not signature_holds(request, CREDENTIALS, "us-east-1")
    assert not signature_holds(request, CREDENTIALS, REGION, service="lambda")
    assert not signature_holds(
        replace(request, body=request.body.replace(b"7c20", b"7c21")), CREDENTIALS, REGION
    )
    assert not signature_holds(replace(request, path="/allocations"), CREDENTIALS, REGION)
    assert not signature_holds(replace(request, method="DELETE"), CREDENTIALS, REGION)


def test_every_block_runs_or_says_why_not() -> None:
    assert len(page()) >= 3, "found too few blocks: the parsing is broken"
    for block in page():
        assert block.skipped_because is None or block.skipped_because.strip(), block.line
    assert [b.language for b in page() if not b.skipped_because] == ["python", "bash"]


def test_the_python_call_is_signed_with_the_sessions_credentials(tmp_path: Path) -> None:
    request = sent_by(the_block("python", "SigV4Auth"), tmp_path)
    assert_signed_and_exact(request)
    authorization = request.header("Authorization") or ""
    # What the doc says the signature covers.
    assert "SignedHeaders=content-type;host;x-amz-date;x-amz-security-token," in authorization
    assert f"/{REGION}/execute-api/aws4_request," in authorization
    assert request.header("X-Amz-Security-Token") == CREDENTIALS.token


def test_the_python_call_prints_a_refusal_without_a_traceback(tmp_path: Path) -> None:
    refusal = b'{"statusCode": 422, "detail": [{"loc": ["body", "key"], "msg": "x"}]}'
    request = sent_by(the_block("python", "SigV4Auth"), tmp_path, 422, refusal)
    assert signature_holds(request, CREDENTIALS, REGION)


def test_the_awscurl_call_is_signed(tmp_path: Path) -> None:
    request = sent_by(the_block("bash", "awscurl"), tmp_path)
    assert_signed_and_exact(request)
    assert request.header("Content-Type") == "application/json"
    assert f"/{REGION}/execute-api/aws4_request," in (request.header("Authorization") or "")


def test_an_unsigned_request_does_not_verify() -> None:
    unsigned = Captured("POST", "/children", (("Host", "127.0.0.1:1"),), b"{}")
    assert not signature_holds(unsigned, CREDENTIALS, REGION)


@given(
    body=st.binary(max_size=512),
    path=st.lists(st.text("abcXYZ019-_.~#", min_size=1, max_size=8), max_size=3),
    flip=st.integers(min_value=0),
)
def test_any_signed_body_verifies_and_no_changed_byte_does(
    body: bytes, path: list[str], flip: int
) -> None:
    """The checker is no rubber stamp: whatever the body and path, botocore's signature of
    them verifies, and the same request with any one byte of its body changed does not."""
    url = "http://127.0.0.1:8080/" + "/".join(p.replace("#", "%23") for p in path)
    signing = AWSRequest("POST", url, data=body, headers={"Content-Type": "application/json"})
    SigV4Auth(CREDENTIALS, "execute-api", REGION).add_auth(signing)
    headers = (("Host", "127.0.0.1:8080"), *signing.headers.items())
    request = Captured("POST", url.removeprefix("http://127.0.0.1:8080"), headers, body)
    assert signature_holds(request, CREDENTIALS, REGION)
    changed = bytearray(body or b"\0")
    changed[flip % len(changed)] ^= 0x01
    assert not signature_holds(replace(request, body=bytes(changed)), CREDENTIALS, REGION)
