"""Shared fixtures: dummy AWS settings, DynamoDB Local and throwaway tables."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import hypothesis
import pytest
from botocore.config import Config

from tally.local.dynamodb_local import DynamoDBLocal, local_client_kwargs
from tally.local.template import create_table, load_template, template_path
from tests.harness.endpoints import endpoint_from_env

INTEGRATION_DIR = Path(__file__).parent / "integration"

# A busy machine is no failure: property tests are judged by their examples, never by a
# per-example deadline.
hypothesis.settings.register_profile("tally", deadline=None)
hypothesis.settings.load_profile("tally")

# The project under test, whatever directory pytest runs from.
os.environ.setdefault("TALLY_TEMPLATE", str(Path(__file__).parents[1] / "template.yaml"))
# Powertools reads these when the handler modules are first imported.
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "tally")
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "TallyTest")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
# The CLI's tables are as wide as COLUMNS says, else as wide as a pipe's: the tests read them
# as a script piping tally would. A terminal may export COLUMNS, and pytest-xdist's workers
# inherit COLUMNS=80 and LINES=24 from the controller (GNU readline, which pdb imports, sets
# them in the process environment), so neither reaches the CLI, in process or spawned.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration as an integration test."""
    for item in items:
        if item.path.is_relative_to(INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def _dummy_aws_env() -> Iterator[None]:
    """Point boto3 at fake credentials so no test can reach a real account by accident."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.delenv("AWS_SESSION_TOKEN", raising=False)
        yield


@pytest.fixture(autouse=True)
def _pending_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no looks on their way, known by the clock moto's in-process SQS
    delays messages by (tests hold and move it): a look counts as pending exactly as long as
    its message is delayed. moto's server, in a process of its own, keeps real time too."""
    import moto.sqs.models

    from tally.reconciler import runtime
    from tally.reconciler.report.scheduling import PendingLooks

    def sqs_clock() -> float:
        return float(moto.sqs.models.unix_time_millis()) / 1000

    monkeypatch.setattr(runtime, "_PENDING_LOOKS", PendingLooks(clock=sqs_clock))


@pytest.fixture(scope="session")
def dynamodb_endpoint() -> Iterator[str]:
    """Endpoint from DYNAMODB_ENDPOINT, else one DynamoDB Local for the whole run.

    Under pytest-xdist each worker is a run of its own: its own DynamoDB Local, on a free
    port, as its own moto server (tests/integration/conftest.py); tests that name their
    tables alike (the local stack's tally-local-table) never meet another worker's.
    """
    endpoint = endpoint_from_env()
    if endpoint:
        yield endpoint
        return
    # A ceiling, not a wait: the JVM answers in seconds, but a busy shared machine is slower.
    with DynamoDBLocal(startup_timeout=120) as ddb:
        yield ddb.endpoint


@pytest.fixture(scope="session")
def dynamodb(dynamodb_endpoint: str) -> Any:
    """A DynamoDB client that 16+ threads can share."""
    config = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=64)
    return boto3.client("dynamodb", config=config, **local_client_kwargs(dynamodb_endpoint))


@pytest.fixture(scope="session")
def dynamodb_streams(dynamodb_endpoint: str) -> Any:
    """A DynamoDB Streams client on the same endpoint."""
    return boto3.client("dynamodbstreams", **local_client_kwargs(dynamodb_endpoint))


@pytest.fixture(scope="session")
def template() -> dict[str, Any]:
    """The parsed template.yaml."""
    return load_template(template_path())


@pytest.fixture
def table_name(dynamodb: Any, template: dict[str, Any]) -> Iterator[str]:
    """A fresh table built from template.yaml's `Table` resource, deleted afterwards."""
    name = f"tally-test-{uuid.uuid4().hex[:12]}"
    create_table(dynamodb, template, "Table", name)
    yield name
    with contextlib.suppress(dynamodb.exceptions.ResourceNotFoundException):
        dynamodb.delete_table(TableName=name)
