"""The carry on DynamoDB Local's real stream, through the real handlers: a hot parent's
split transactions read no child, and what nothing cancels is recounted after the window."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tally.core.settings import settings
from tally.reconciler.checks.counts import SMALL_PARENT
from tally.reconciler.table.parent_reads import ParentReads
from tally.rules import load_rules
from tally.writers import TallyWriter
from tests.integration.conftest import RULES_FILE, Stack

RULES = load_rules(RULES_FILE)
POST = {"PK": "POST#hot", "SK": "META"}
LIKES = SMALL_PARENT + 20  # above the small-parent threshold: remainders are carried
WINDOW = 1


@pytest.fixture
def hot(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A hot post with consistent likes; yields the log of child recounts."""
    monkeypatch.setenv("CARRY_SECONDS", str(WINDOW))
    settings.cache_clear()
    requests = [
        {"PutRequest": {"Item": {"PK": {"S": "POST#hot"}, "SK": {"S": f"LIKE#USER#{n:04d}"}}}}
        for n in range(LIKES)
    ]
    for start in range(0, len(requests), 25):
        stack.dynamodb.batch_write_item(RequestItems={stack.table: requests[start : start + 25]})
    stack.put({**POST, "likeTally": LIKES, "tallyRevision": 1})
    stack.records()  # the seeding is not what is verified
    recounts: list[str] = []
    recount = ParentReads.tally_children

    def counted(table: ParentReads, rule: Any, key: dict[str, str]) -> Any:
        recounts.append(key["PK"])
        return recount(table, rule, key)

    monkeypatch.setattr(ParentReads, "tally_children", counted)
    yield recounts


def like(stack: Stack, n: int) -> None:
    TallyWriter(stack.dynamodb, stack.table, RULES).add_child(
        {"PK": "POST#hot", "SK": f"LIKE#NEW#{n}"}
    )


def wait_rechecks(stack: Stack, timeout: float = 30) -> int:
    """Deliver rechecks as their delays run out, until none is pending; returns how many."""
    delivered, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivered += stack.run_rechecks()
        if not stack.pending_rechecks():
            return delivered
        time.sleep(0.2)
    raise AssertionError("rechecks still pending")


def test_a_split_transaction_redelivered_and_bisected_reads_no_child(
    stack: Stack, hot: list[str]
) -> None:
    for n in range(3):
        like(stack, n)
    records = stack.records()
    assert len(records) == 6
    first, second = records[:3], records[3:]  # the boundary splits the second like
    for batch in (first, second, second, first, records[:1], records[1:3], records[4:], records):
        assert stack.deliver(copy.deepcopy(batch))["batchItemFailures"] == []
    wait_rechecks(stack)  # the window of the remainder the first batch left
    assert hot == []
    assert stack.alerts() == [] and stack.audit.log.findings() == []
    assert stack.audit.carries.carry("likes", POST).remainder == 0


def test_balanced_batches_split_mid_transaction_still_fold_the_open_remainder(
    stack: Stack, hot: list[str]
) -> None:
    """Steady traffic: every batch begins with the other half of the previous one's last
    like, so each is balanced; a warm handler folds it anyway, giving the remainder that
    follows a window of its own instead of leaving the first one open until it is recounted."""
    for n in range(3):
        like(stack, n)
    records = stack.records()
    stack.deliver(records[:1])
    opened = stack.audit.carries.carry("likes", POST)
    stack.deliver(records[1:3])
    carry = stack.audit.carries.carry("likes", POST)
    assert carry.remainder == opened.remainder != 0 and carry.since > opened.since
    for batch in (records[3:5], records[5:]):
        stack.deliver(batch)
    wait_rechecks(stack)
    assert hot == [] and stack.alerts() == []
    assert stack.audit.carries.carry("likes", POST).remainder == 0


def test_a_remainder_nothing_cancels_is_recounted_after_the_window(
    stack: Stack, hot: list[str]
) -> None:
    like(stack, 0)
    records = stack.records()
    stack.deliver(records[:1])  # half a legitimate like; its other half is never delivered
    assert hot == []
    assert stack.audit.carries.carry("likes", POST).remainder != 0
    assert wait_rechecks(stack) == 1
    assert hot == ["POST#hot"]
    assert stack.alerts() == []  # the table itself was consistent
    assert stack.audit.carries.carry("likes", POST).remainder == 0


def test_a_rogue_write_on_a_hot_parent_is_caught_after_the_window(
    stack: Stack, hot: list[str]
) -> None:
    like(stack, 0)
    stack.pump()
    written = datetime.now(UTC)
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key={"PK": {"S": "POST#hot"}, "SK": {"S": "META"}},
        UpdateExpression="SET likeTally = likeTally + :n",
        ExpressionAttributeValues={":n": {"N": "7"}},
    )
    stack.pump()
    assert hot == [] and stack.alerts() == []  # carried, not recounted at once
    assert wait_rechecks(stack) == 1  # the first recheck after the window catches it
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", LIKES + 8, LIKES + 1)
    assert alert["repair"]["status"] == "applied"
    detected = datetime.fromisoformat(alert["detected_at"].replace("Z", "+00:00"))
    print(f"detection latency {(detected - written).total_seconds():.2f} s, window {WINDOW} s")
    stack.settle()  # the repair's own record comes back and is recognised
    assert stack.alerts() == []
    assert stack.item("POST#hot", "META")["likeTally"] == LIKES + 1  # type: ignore[index]
