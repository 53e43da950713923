"""The seed articles' writer code as written (syntax slips fixed), and the faults to inject.

Each writer takes a boto3 client (seed 002: a boto3 ``Table`` resource, as the article
does) and the table name; the articles' own names (``Users``, ``orders``...) become the
local table. Slips fixed: numbers go to DynamoDB as strings (``{"N": "1"}``), the value read
back is converted with ``int`` before ``+ 1``, the seed 000 problem's ``update_item`` asks for
``ReturnValues`` (it uses ``next_id`` without reading it), and the C# of seed 003 is boto3.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from boto3.dynamodb.conditions import Key
from botocore.exceptions import ReadTimeoutError

# Seed 001's and seed 004's writers are in tally.local.examples: users load them too.
from tally.local.examples import Crash


class LosesResponse:
    """A client whose next call of ``operation`` commits, then raises as if the response
    were lost on the way back (the caller cannot tell it from a failure)."""

    def __init__(self, client: Any, operation: str):
        self._client = client
        self._operation = operation
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if name != self._operation or self.lost:
            return method

        def commit_then_raise(**kwargs: Any) -> Any:
            method(**kwargs)
            self.lost += 1
            raise ReadTimeoutError(endpoint_url="http://dynamodb.local")

        return commit_then_raise


def retried(write: Callable[[], Any], attempts: int = 3) -> Any:
    """The application's own retry around a writer: a lost response looks like a failure."""
    for attempt in range(attempts):
        try:
            return write()
        except ReadTimeoutError:
            if attempt == attempts - 1:
                raise
    return None


# --- seed 000: Users, counter LastID on UserMetadata, NumIdentifier on User#<name> -----------


class UserExists(Exception):
    """The put's condition failed: the user is there already (the counter kept its value)."""


def create_user_metadata(client: Any, table: str) -> None:
    client.put_item(TableName=table, Item={"PK": {"S": "UserMetadata"}, "LastID": {"N": "0"}})


def add_user(client: Any, table: str, name: str) -> int:
    """The good solution: read LastID, then the increment (fenced on it) and the user's put in
    one transaction; retried from the read while another writer moved LastID."""
    while True:
        user_metadata = client.get_item(
            TableName=table,
            Key={"PK": {"S": "UserMetadata"}},
            AttributesToGet=["LastID"],
            ConsistentRead=True,
        )
        current_id = user_metadata["Item"]["LastID"]["N"]
        next_id = int(current_id) + 1
        try:
            client.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": table,
                            "Key": {"PK": {"S": "UserMetadata"}},
                            "ConditionExpression": "LastID = :current_id",
                            "UpdateExpression": "SET LastID = LastID + :incr",
                            "ExpressionAttributeValues": {
                                ":incr": {"N": "1"},
                                ":current_id": {"N": current_id},
                            },
                        },
                    },
                    {
                        "Put": {
                            "TableName": table,
                            "Item": {
                                "PK": {"S": f"User#{name}"},
                                "NumIdentifier": {"N": str(next_id)},
                                "UserName": {"S": name},
                            },
                            "ConditionExpression": "attribute_not_exists(PK)",
                        },
                    },
                ],
            )
            return next_id
        except client.exceptions.TransactionCanceledException as error:
            reasons = [r.get("Code") for r in error.response["CancellationReasons"]]
            if reasons[1] == "ConditionalCheckFailed":
                raise UserExists(name) from error  # cancelled: LastID kept its value
            if reasons[0] != "ConditionalCheckFailed":
                raise


def add_user_non_transactional(client: Any, table: str, name: str) -> int:
    """The problem: the atomic increment, then the put; a put that fails leaves a gap."""
    response = client.update_item(
        TableName=table,
        Key={"PK": {"S": "UserMetadata"}},
        UpdateExpression="SET LastID = LastID + :incr",
        ExpressionAttributeValues={":incr": {"N": "1"}},
        ReturnValues="UPDATED_NEW",
    )
    next_id = response["Attributes"]["LastID"]["N"]
    client.put_item(
        TableName=table,
        Item={
            "PK": {"S": f"User#{name}"},
            "NumIdentifier": {"N": next_id},
            "UserName": {"S": name},
        },
        ConditionExpression="attribute_not_exists(PK)",
    )
    return int(next_id)


def add_user_create_then_update(client: Any, table: str, name: str, *, crash: bool) -> None:
    """Bad solution 2: the user with a placeholder, the increment, then the user's number."""
    client.put_item(
        TableName=table,
        Item={"PK": {"S": f"User#{name}"}, "NumIdentifier": {"N": "0"}, "UserName": {"S": name}},
        ConditionExpression="attribute_not_exists(PK)",
    )
    response = client.update_item(
        TableName=table,
        Key={"PK": {"S": "UserMetadata"}},
        UpdateExpression="SET LastID = LastID + :incr",
        ExpressionAttributeValues={":incr": {"N": "1"}},
        ReturnValues="UPDATED_NEW",
    )
    if crash:
        raise Crash("between the increment and the user's update")
    client.update_item(
        TableName=table,
        Key={"PK": {"S": f"User#{name}"}},
        UpdateExpression="SET NumIdentifier = :id",
        ExpressionAttributeValues={":id": response["Attributes"]["LastID"]},
    )


# --- seed 002: issues numbered by the highest sort key, no counter -----------------------------


def open_issue(table: Any, project: str) -> int:
    """Seed 002's writer: the highest sort key plus one, put only if absent, else one higher."""
    highest_issue_id = 0
    saved = False
    response = table.query(
        KeyConditionExpression=Key("pk").eq(project), ScanIndexForward=False, Limit=1
    )
    if response["Count"] > 0:
        highest_issue_id = int(response["Items"][0]["sk"])
    while not saved:
        try:
            table.put_item(
                Item={"pk": project, "sk": highest_issue_id + 1, "priority": "low"},
                ConditionExpression="attribute_not_exists(pk)",
            )
            saved = True
        except table.meta.client.exceptions.ConditionalCheckFailedException:
            highest_issue_id = highest_issue_id + 1
    return highest_issue_id + 1


# --- seed 003: optimistic locking; the counter holds the next free number ----------------------


def create_counter(client: Any, table: str) -> None:
    client.put_item(TableName=table, Item={"pk": {"S": "counter"}, "count_value": {"N": "0"}})


def take_number(client: Any, table: str, *, crash: bool = False) -> int:
    """Seed 003's optimistic locking: read, ADD 1 fenced on the value read, then put the item
    under the value read; retried from the read when another writer got there first."""
    return take_next_free(
        client,
        table,
        {"pk": {"S": "counter"}},
        "count_value",
        lambda current_count: {
            "pk": {"S": current_count},
            "some_attribute": {"S": "This item guaranteed to have unique PK! Woohoo!"},
        },
        crash=crash,
    )


def take_next_free(
    client: Any,
    table: str,
    counter: dict[str, Any],
    attribute: str,
    member: Callable[[str], dict[str, Any]],
    *,
    between: Callable[[], Any] | None = None,
    crash: bool = False,
) -> int:
    """Seed 003's steps as written (read, ADD 1 fenced on the value read, put
    ``member(value read)``) for any counter item and member (``take_number`` is the seed's
    own). ``between`` runs between the lock and the item: a reconciler's look at that
    moment."""
    while True:
        current_count_item = client.get_item(
            TableName=table, Key=counter, AttributesToGet=[attribute]
        )
        current_count = current_count_item["Item"][attribute]["N"]
        try:
            client.update_item(
                TableName=table,
                Key=counter,
                UpdateExpression="ADD #count :increment",
                ConditionExpression="#count = :current_count",
                ExpressionAttributeNames={"#count": attribute},
                ExpressionAttributeValues={
                    ":increment": {"N": "1"},
                    ":current_count": {"N": current_count},
                },
            )
            break
        except client.exceptions.ConditionalCheckFailedException:
            continue
    if between is not None:
        between()
    if crash:
        raise Crash("between the lock and the item")
    client.put_item(TableName=table, Item=member(current_count))
    return int(current_count)


# --- seed 004: likes and their count split in two writes (the writer: tally.local.examples) ---


def like_non_transactional(client: Any, table: str, post: str, user: str, *, crash: bool) -> None:
    """The two writes the article warns against splitting: the like, then the count."""
    client.put_item(
        TableName=table,
        Item={"PK": {"S": post}, "SK": {"S": f"LIKE#USER#{user}"}, "likedAt": {"N": "1"}},
        ConditionExpression="attribute_not_exists(SK)",
    )
    if crash:
        raise Crash("between the like and its count")
    client.update_item(
        TableName=table,
        Key={"PK": {"S": post}, "SK": {"S": "META"}},
        UpdateExpression="ADD likeTally :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
