"""boto3 clients with the retry settings every module shares."""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore.config import Config

# Standard mode retries throttling and transient errors with jittered backoff, and a
# transaction whose token is still in progress (TransactionInProgressException); transaction
# cancellations are not retried here: ``dynamodb.transact`` decodes them per item and retries
# the transient ones (TransactionConflict, ThrottlingError) itself.
RETRY_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=64)


# Local endpoints a function may be given (empty in AWS). Plain boto3 programs use boto3's
# own AWS_ENDPOINT_URL_<SERVICE>; these exist because the template can declare them empty,
# which boto3's variables cannot be, for `sam local invoke --env-vars`.
_LOCAL_ENDPOINTS = {
    "dynamodb": "DYNAMODB_ENDPOINT",
    "dynamodbstreams": "DYNAMODB_ENDPOINT",
    "sns": "SNS_ENDPOINT",
    "sqs": "SQS_ENDPOINT",
    "ssm": "SSM_ENDPOINT",
}


def client(service: str, **overrides: Any) -> Any:
    """A client for ``service``, on a local endpoint when one is set."""
    kwargs: dict[str, Any] = {"config": RETRY_CONFIG}
    endpoint = os.environ.get(_LOCAL_ENDPOINTS.get(service, ""), "")
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    kwargs.update(overrides)
    factory: Any = boto3.client  # typed overloads want a literal service name
    return factory(service, **kwargs)


def dynamodb_client(**overrides: Any) -> Any:
    return client("dynamodb", **overrides)
