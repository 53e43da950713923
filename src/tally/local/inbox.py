"""The local alert subscriber: a queue on the topic, kept as a file so it can be re-read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tally.local.state import ALERTS_FILE


def collect(sqs: Any, inbox_url: str, state_dir: Path) -> list[dict[str, Any]]:
    """Move what the subscriber queue holds into the alerts file; return every alert so far."""
    seen = state_dir / ALERTS_FILE
    while True:
        messages = sqs.receive_message(
            QueueUrl=inbox_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
        ).get("Messages", [])
        if not messages:
            break
        with seen.open("a") as out:
            for message in messages:
                body = json.loads(json.loads(message["Body"])["Message"])
                out.write(json.dumps(body, sort_keys=True) + "\n")
        for message in messages:
            sqs.delete_message(QueueUrl=inbox_url, ReceiptHandle=message["ReceiptHandle"])
    lines = seen.read_text().splitlines() if seen.exists() else []
    return [json.loads(line) for line in lines]


def line(body: dict[str, Any]) -> str:
    """One alert as a readable line."""
    where = "/".join(str(v) for v in body["key"].values())
    if "number" in body:
        what = f"number {body['number']}"
    else:
        what = f"stored {body['stored']} actual {body['actual']}"
    status = body["repair"]["status"]
    return f"{body['kind']} of {body['rule']} at {where}: {what}, repair {status}"
