"""The fault harness itself, on DynamoDB Local and moto's SNS/SQS server."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ReadTimeoutError

from tally.local.dynamodb_local import local_client_kwargs
from tests.harness.faults import Faults

ADD_ONE = {
    "Key": {"PK": {"S": "COUNTER"}, "SK": {"S": "META"}},
    "UpdateExpression": "ADD n :one",
    "ExpressionAttributeValues": {":one": {"N": "1"}},
}


@pytest.fixture
def client(dynamodb_endpoint: str) -> Any:
    """A client of its own: the harness hooks into one client only."""
    config = Config(retries={"mode": "standard", "max_attempts": 5})
    return boto3.client("dynamodb", config=config, **local_client_kwargs(dynamodb_endpoint))


def counter(client: Any, table: str) -> int:
    item = client.get_item(TableName=table, Key=ADD_ONE["Key"], ConsistentRead=True)["Item"]
    return int(item["n"]["N"])


def test_a_lost_response_was_committed_and_botocore_resent_it(client: Any, table_name: str) -> None:
    # UpdateItem carries no idempotency token: every lost response shows as one more ADD.
    with Faults(client, lost=0.5, seed=3, operations={"UpdateItem"}) as faults:
        for _ in range(20):
            client.update_item(TableName=table_name, **ADD_ONE)
    stats = faults.stats["UpdateItem"]
    assert stats.calls == 20
    assert stats.lost > 0
    assert stats.attempts == stats.calls + stats.lost
    assert counter(client, table_name) == stats.attempts


def test_a_lost_transaction_response_is_replayed_under_botocores_token(
    client: Any, table_name: str
) -> None:
    item = {"Update": {"TableName": table_name, **ADD_ONE}}
    with Faults(client, lost=0.5, seed=3, operations={"TransactWriteItems"}) as faults:
        for _ in range(20):
            client.transact_write_items(TransactItems=[item])
    assert faults.stats["TransactWriteItems"].lost > 0
    assert counter(client, table_name) == 20


def test_down_and_throttled_attempts_are_never_sent(client: Any, table_name: str) -> None:
    with Faults(client, down=0.3, throttled=0.3, seed=5) as faults:
        for _ in range(20):
            client.update_item(TableName=table_name, **ADD_ONE)
    stats = faults.stats["UpdateItem"]
    assert stats.down > 0 and stats.throttled > 0 and stats.lost == 0
    assert counter(client, table_name) == 20


def test_the_same_seed_draws_the_same_faults(client: Any, table_name: str) -> None:
    runs = []
    for _ in range(2):
        with Faults(client, lost=0.4, seed=11) as faults:
            for _ in range(10):
                client.update_item(TableName=table_name, **ADD_ONE)
        runs.append(faults.stats["UpdateItem"])
    assert runs[0] == runs[1]


def test_untargeted_operations_are_counted_but_never_faulted(client: Any, table_name: str) -> None:
    with Faults(client, lost=1.0, operations={"PutItem"}) as faults:
        client.update_item(TableName=table_name, **ADD_ONE)
        client.get_item(TableName=table_name, Key=ADD_ONE["Key"])
    assert faults.stats["UpdateItem"].faults == faults.stats["GetItem"].faults == 0
    assert faults.stats["GetItem"].calls == 1


def test_without_a_spare_attempt_a_call_fails_once_retries_run_out(
    client: Any, table_name: str
) -> None:
    with (
        Faults(client, lost=1.0, spare_last_attempt=False) as faults,
        pytest.raises(ReadTimeoutError),
    ):
        client.update_item(TableName=table_name, **ADD_ONE)
    assert faults.stats["UpdateItem"].attempts == 6  # max_attempts=5 retries after the first
    assert counter(client, table_name) == 6


def test_sns_and_sqs_calls_survive_lost_responses_and_throttling(moto_endpoint: str) -> None:
    local = {"endpoint_url": moto_endpoint, "region_name": "us-east-1"}
    config = Config(retries={"mode": "standard", "max_attempts": 5})
    sns = boto3.client("sns", config=config, **local)
    sqs = boto3.client("sqs", config=config, **local)
    topic = sns.create_topic(Name="faults")["TopicArn"]
    queue = sqs.create_queue(QueueName="faults")["QueueUrl"]
    with Faults(sns, lost=0.3, throttled=0.3, seed=2) as sns_faults:
        for n in range(10):
            sns.publish(TopicArn=topic, Message=f"alert {n}")
    with Faults(sqs, lost=0.5, seed=2, operations={"SendMessage"}) as sqs_faults:
        for n in range(10):
            sqs.send_message(QueueUrl=queue, MessageBody=f"recheck {n}")
    assert sns_faults.stats["Publish"].throttled > 0
    assert sns_faults.stats["Publish"].lost > 0
    lost = sqs_faults.stats["SendMessage"].lost
    assert lost > 0
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    # SendMessage has no idempotency token: each lost response is one more message.
    assert int(attributes["ApproximateNumberOfMessages"]) == 10 + lost


def test_a_client_without_standard_retries_is_refused(dynamodb_endpoint: str) -> None:
    legacy = boto3.client("dynamodb", **local_client_kwargs(dynamodb_endpoint))
    with pytest.raises(ValueError, match="standard"):
        Faults(legacy, lost=0.5)
