"""The DynamoDB that tests and benchmarks use instead of starting their own, when one is set."""

from __future__ import annotations

import os


def endpoint_from_env() -> str | None:
    """Return an already-running DynamoDB endpoint configured in the environment."""
    return os.environ.get("DYNAMODB_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
