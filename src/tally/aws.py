"""boto3 clients with the retry settings every module shares."""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore.config import Config

# Standard mode retries throttling and transient errors with jittered backoff; transaction
# cancellations are not retried here: the writers decode them per item.
RETRY_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=64)


def client(service: str, **overrides: Any) -> Any:
    """A client for ``service``; ``DYNAMODB_ENDPOINT`` selects a local DynamoDB engine.

    Other local endpoints come from boto3's own ``AWS_ENDPOINT_URL_<SERVICE>`` variables.
    """
    kwargs: dict[str, Any] = {"config": RETRY_CONFIG}
    endpoint = os.environ.get("DYNAMODB_ENDPOINT")
    if endpoint and service in ("dynamodb", "dynamodbstreams"):
        kwargs["endpoint_url"] = endpoint
    kwargs.update(overrides)
    factory: Any = boto3.client  # typed overloads want a literal service name
    return factory(service, **kwargs)


def dynamodb_client(**overrides: Any) -> Any:
    return client("dynamodb", **overrides)
