"""Helpers shared by the tests: a Lambda context, item conversions, stream records, exports."""

from __future__ import annotations

import base64
import gzip
import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

from boto3.dynamodb.types import TypeSerializer

from tally.core.dynamodb import Deserializer
from tally.local.runner import LocalContext

_ser, _de = TypeSerializer(), Deserializer()


def lambda_context(name: str = "tally-test") -> LocalContext:
    """The context local mode passes to handlers (the attributes Powertools reads)."""
    return LocalContext(name)


def serialize(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _ser.serialize(v) for k, v in item.items()}


def deserialize(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _de.deserialize(v) for k, v in item.items()}


TTL_IDENTITY = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
_sequence = itertools.count(1000)


def stream_record(
    event: str,
    keys: dict[str, str],
    new: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    *,
    seq: str | None = None,
    at: int = 1_700_000_000,
    identity: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A DynamoDB stream record in Lambda's shape; images include the keys, as DynamoDB's do."""
    stream: dict[str, Any] = {
        "Keys": serialize(keys),
        "SequenceNumber": seq or str(next(_sequence)),
        "ApproximateCreationDateTime": at,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    if new is not None:
        stream["NewImage"] = serialize({**keys, **new})
    if old is not None:
        stream["OldImage"] = serialize({**keys, **old})
    body: dict[str, Any] = {
        "eventID": f"ev-{stream['SequenceNumber']}",
        "eventName": event,
        "eventSource": "aws:dynamodb",
        "dynamodb": stream,
    }
    if identity is not None:
        body["userIdentity"] = identity
    return body


def write_aws_export(
    root: Path,
    items: list[dict[str, Any]],
    *,
    prefix: str = "audits/tally",
    export_id: str = "01736985600000-a1b2c3d4",
    files: int = 2,
) -> Path:
    """``items`` (DynamoDB JSON) as DynamoDB's export to S3 lays them out, downloaded as is.

    The keys carry the export prefix and the bucket is named, as in AWS; one data file is
    empty, as an empty partition's is.
    """
    base = f"{prefix}/AWSDynamoDB/{export_id}"
    directory = root / base
    (directory / "data").mkdir(parents=True)
    (directory / "_started").touch()
    lines = []
    for index in range(files + 1):
        chunk = items[index::files] if index < files else []
        name = f"{index:04d}{export_id[-8:]}.json.gz"
        body = "".join(json.dumps({"Item": item}) + "\n" for item in chunk).encode()
        data = gzip.compress(body) if chunk else b""
        (directory / "data" / name).write_bytes(data)
        digest = hashlib.md5(data)
        lines.append(
            {
                "itemCount": len(chunk),
                "md5Checksum": base64.b64encode(digest.digest()).decode(),
                "etag": digest.hexdigest(),
                "dataFileS3Key": f"{base}/data/{name}",
            }
        )
    manifest = "".join(json.dumps(line) + "\n" for line in lines)
    (directory / "manifest-files.json").write_text(manifest)
    (directory / "manifest-files.checksum").write_text(hashlib.md5(manifest.encode()).hexdigest())
    summary = {
        "version": "2020-06-30",
        "exportArn": f"arn:aws:dynamodb:us-east-1:123456789012:table/tally/export/{export_id}",
        "startTime": "2025-01-16T00:00:00.000Z",
        "endTime": "2025-01-16T00:06:12.345Z",
        "tableArn": "arn:aws:dynamodb:us-east-1:123456789012:table/tally",
        "tableId": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
        "exportTime": "2025-01-16T00:00:00.000Z",
        "s3Bucket": "tally-audit-123456789012",
        "s3Prefix": prefix,
        "s3SseAlgorithm": "AES256",
        "s3SseKmsKeyId": None,
        "manifestFilesS3Key": f"{base}/manifest-files.json",
        "billedSizeBytes": 4096,
        "itemCount": len(items),
        "outputFormat": "DYNAMODB_JSON",
        "exportType": "FULL_EXPORT",
    }
    text = json.dumps(summary)
    (directory / "manifest-summary.json").write_text(text)
    (directory / "manifest-summary.checksum").write_text(hashlib.md5(text.encode()).hexdigest())
    return directory
