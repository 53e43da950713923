"""Helpers shared by the tests: a Lambda context and item conversions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

_ser, _de = TypeSerializer(), TypeDeserializer()


@dataclass
class LambdaContext:
    """The attributes Powertools reads from a Lambda context."""

    function_name: str = "tally-test"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:tally-test"
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def serialize(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _ser.serialize(v) for k, v in item.items()}


def deserialize(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _de.deserialize(v) for k, v in item.items()}
