"""boto3 clients with the retry settings every module shares."""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore.config import Config

# Standard mode retries throttling and transient errors with jittered backoff; transaction
# cancellations are not retried here: the writers decode them per item.
RETRY_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=64)


def dynamodb_client(**overrides: Any) -> Any:
    """A DynamoDB client; ``DYNAMODB_ENDPOINT`` (or boto3's own variable) selects a local engine."""
    endpoint = os.environ.get("DYNAMODB_ENDPOINT")
    kwargs: dict[str, Any] = {"config": RETRY_CONFIG}
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    kwargs.update(overrides)
    return boto3.client("dynamodb", **kwargs)
