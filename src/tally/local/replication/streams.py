"""Reading one table's stream in one Region from where it began, shard by shard, in order
(the project's stream reader, as the pump reads it), with each image back in the wire's
shape: what the replicator forwards is what that Region's own writers wrote."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from tally.core.streams import StreamReader


def _raw(value: Mapping[str, Any]) -> dict[str, Any]:
    """One attribute value as boto3 takes it: the reader's base64 binaries decoded again."""
    ((kind, inner),) = value.items()
    if kind == "B":
        return {"B": base64.b64decode(inner)}
    if kind == "BS":
        return {"BS": [base64.b64decode(item) for item in inner]}
    if kind == "L":
        return {"L": [_raw(item) for item in inner]}
    if kind == "M":
        return {"M": raw_image(inner)}
    return {kind: inner}


def raw_image(image: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _raw(value) for name, value in image.items()}


class StreamTail:
    """Every record of a stream, once, in each shard's order (a child after its parent)."""

    def __init__(self, streams: Any, stream_arn: str):
        self._reader = StreamReader(streams, stream_arn)

    def read(self) -> list[dict[str, Any]]:
        """All records written since the last read, across the stream's shards."""
        return self._reader.drain(limit=1000, idle_polls=1)
