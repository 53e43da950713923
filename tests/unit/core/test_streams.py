"""A poll that fails part-way through the shards hands out what it read, and loses nothing."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from tally.core.streams import StreamReader

ARN = "arn:aws:dynamodb:us-east-1:000000000000:table/t/stream/2026-01-01T00:00:00.000"


class TwoShards:
    """A Streams API with two open shards; reading the second fails while ``down``."""

    class exceptions:  # boto3's name for a client's error classes
        class ExpiredIteratorException(Exception):
            pass

    def __init__(self) -> None:
        self.down = True
        self.records = {"shard-a": ["101", "102"], "shard-b": ["201", "202"]}

    def describe_stream(self, **_: Any) -> dict[str, Any]:
        shards = [{"ShardId": shard} for shard in self.records]
        return {"StreamDescription": {"Shards": shards}}

    def get_shard_iterator(self, ShardId: str, **_: Any) -> dict[str, str]:
        return {"ShardIterator": ShardId}

    def get_records(self, ShardIterator: str, **_: Any) -> dict[str, Any]:
        if ShardIterator == "shard-b" and self.down:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
        numbers = self.records[ShardIterator]
        self.records[ShardIterator] = []
        return {
            "Records": [
                {
                    "eventID": n,
                    "eventName": "INSERT",
                    "eventVersion": "1.1",
                    "dynamodb": {"SequenceNumber": n, "Keys": {"PK": {"S": n}}},
                }
                for n in numbers
            ],
            "NextShardIterator": ShardIterator,
        }


def numbers(batches: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, list[str]]:
    return {shard: [r["dynamodb"]["SequenceNumber"] for r in rs] for shard, rs in batches}


def test_a_shard_failing_after_another_was_read_keeps_the_records_read() -> None:
    streams = TwoShards()
    reader = StreamReader(streams, ARN)
    assert numbers(reader.poll_batches()) == {"shard-a": ["101", "102"]}
    streams.down = False
    assert numbers(reader.poll_batches()) == {"shard-b": ["201", "202"]}


def test_a_poll_that_read_nothing_before_failing_raises() -> None:
    streams = TwoShards()
    streams.records["shard-a"] = []
    with pytest.raises(EndpointConnectionError):
        StreamReader(streams, ARN).poll_batches()
