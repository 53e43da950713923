"""Seed-style writers adopted for a Global Table, on the live table's keys and rules
(``src/rules.toml``): a team's own code, not the project's writers, written as the seed
articles write and stamped as docs/adopting.md's "Seed 003 on a Global Table" shows.

- ``like``: seed 004's like (``tally.local.examples.like``): one hand-written
  ``transact_write_items``, the like put only while absent and ``ADD likeTally :one`` on the
  post. Adopted: the like carries ``tallyOrigin`` and a ``tallyChildId`` made here; the post's
  update sets ``tallyOrigin`` and adds one to ``tallyWrites@<Region>``, as the project's
  writers stamp a parent (``tally.writers.regional``). It does not bump the rule's revision
  (``tallyRevision``): the seed knows nothing of it, and its likes only ever add.
- ``take_issue``: seed 003's optimistic locking (``tests.harness.seeds.take_next_free``, the
  steps as written: read the counter, ``ADD 1`` fenced on the value read, then an
  unconditional put), on a project of the ``issue-numbers`` rule. That rule's ``lastIssue``
  holds the last number handed out where seed 003's ``count_value`` holds the next, so the
  member goes under the value read plus one. Adopted: the put carries ``tallyOrigin`` and
  ``tallyChildId``, and nothing else changes (the counter's update stays the seed's).

Each returns what its caller was told: the key and child id it created, or None.
"""

from __future__ import annotations

import uuid
from typing import Any

from tally.core.regions import CHILD_ID, ORIGIN, writes
from tests.harness.seeds import take_next_free


def new_id(region: str) -> str:
    return f"{region}:{uuid.uuid4().hex}"


def like(client: Any, table: str, region: str, post: str, user: str) -> str | None:
    """Seed 004's like, adopted; the like's child id, or None when the user had liked the
    post already (the transaction was cancelled on the like's condition)."""
    child_id = new_id(region)
    liked = {
        "PK": {"S": post},
        "SK": {"S": f"LIKE#USER#{user}"},
        "likedAt": {"N": "1750636800"},
        ORIGIN: {"S": region},
        CHILD_ID: {"S": child_id},
    }
    tally = {
        "TableName": table,
        "Key": {"PK": {"S": post}, "SK": {"S": "META"}},
        "UpdateExpression": "SET #origin = :origin ADD likeTally :one, #writes :one",
        "ExpressionAttributeNames": {"#origin": ORIGIN, "#writes": writes(region)},
        "ExpressionAttributeValues": {":one": {"N": "1"}, ":origin": {"S": region}},
    }
    put = {"TableName": table, "Item": liked, "ConditionExpression": "attribute_not_exists(SK)"}
    try:
        client.transact_write_items(TransactItems=[{"Put": put}, {"Update": tally}])
    except client.exceptions.TransactionCanceledException as error:
        reasons = [r.get("Code") for r in error.response.get("CancellationReasons", [])]
        if reasons and reasons[0] == "ConditionalCheckFailed":
            return None  # liked already: nothing written
        raise
    return child_id


def take_issue(client: Any, table: str, region: str, project: str) -> tuple[str, str]:
    """Seed 003's allocator, adopted, on ``project``'s ``COUNTER#ISSUE``: the member's sort
    key and child id."""
    made: dict[str, str] = {}

    def member(current_count: str) -> dict[str, Any]:
        made["SK"] = f"ISSUE#{int(current_count) + 1:010d}"
        made["id"] = new_id(region)
        return {
            "PK": {"S": project},
            "SK": {"S": made["SK"]},
            "title": {"S": f"taken in {region}"},
            ORIGIN: {"S": region},
            CHILD_ID: {"S": made["id"]},
        }

    counter = {"PK": {"S": project}, "SK": {"S": "COUNTER#ISSUE"}}
    take_next_free(client, table, counter, "lastIssue", member)
    return made["SK"], made["id"]
