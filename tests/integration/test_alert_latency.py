"""Faults on small parents are alerted by the batch that carries them, not a window later.

A small parent's recount costs less than the carry, so it is recounted at once: these
tests deliver the stream once and run no recheck, so a fault that waited for the carry's
window would not be alerted yet.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from tally.core.settings import settings
from tally.reconciler import runtime
from tally.rules import load_rules
from tally.writers import TallyWriter
from tests.integration.conftest import RULES_FILE, Stack
from tests.utils import serialize

RULES = load_rules(RULES_FILE)
POST = {"PK": "POST#a91f", "SK": "META"}
ORDER = {"PK": "ORDER#17", "SK": "META"}


def post_with_likes(stack: Stack, likes: int) -> None:
    stack.put({**POST, "likeTally": 0})
    w = TallyWriter(stack.dynamodb, stack.table, RULES)
    for user in range(likes):
        w.add_child({"PK": "POST#a91f", "SK": f"LIKE#USER#{user}"})
    stack.settle()
    assert stack.alerts() == []


def order_with_lines(stack: Stack, lines: int) -> None:
    stack.put({**ORDER, "total": 0})
    w = TallyWriter(stack.dynamodb, stack.table, RULES)
    for line in range(lines):
        w.add_child({"PK": "ORDER#17", "SK": f"LINE#{line:04d}"}, {"amount": Decimal("1.25")})
    stack.settle()
    assert stack.alerts() == []


def set_attribute(stack: Stack, key: dict[str, str], name: str, value: Decimal) -> None:
    stack.dynamodb.update_item(
        TableName=stack.table,
        Key=serialize(key),
        UpdateExpression="SET #a = :v",
        ExpressionAttributeNames={"#a": name},
        ExpressionAttributeValues=serialize({":v": value}),
    )


def test_a_rogue_large_count_on_a_small_post_is_alerted_by_its_batch(stack: Stack) -> None:
    post_with_likes(stack, 20)
    set_attribute(stack, POST, "likeTally", Decimal(1010))
    stack.pump()
    [alert] = stack.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 1010, 20)


def test_a_line_put_without_its_total_is_alerted_by_its_batch(stack: Stack) -> None:
    order_with_lines(stack, 3)
    stack.put({"PK": "ORDER#17", "SK": "LINE#9999", "amount": Decimal("10.5")})
    stack.pump()
    [alert] = stack.alerts()
    assert (alert["kind"], Decimal(str(alert["actual"]))) == ("drift", Decimal("14.25"))


def test_a_line_deleted_without_its_total_is_alerted_by_its_batch(stack: Stack) -> None:
    order_with_lines(stack, 3)
    stack.delete("ORDER#17", "LINE#0001")
    stack.pump()
    [alert] = stack.alerts()
    assert (alert["kind"], Decimal(str(alert["actual"]))) == ("drift", Decimal("2.50"))


def test_a_rogue_total_on_a_small_order_is_alerted_by_its_batch(stack: Stack) -> None:
    order_with_lines(stack, 3)
    set_attribute(stack, ORDER, "total", Decimal("12345.67"))
    stack.pump()
    [alert] = stack.alerts()
    assert (alert["kind"], Decimal(str(alert["stored"]))) == ("drift", Decimal("12345.67"))


def test_a_split_line_on_a_large_order_is_carried_not_recounted(stack: Stack) -> None:
    """Past SMALL_PARENT lines the transaction's halves still cancel through the carry."""
    order_with_lines(stack, 101)
    TallyWriter(stack.dynamodb, stack.table, RULES).add_child(
        {"PK": "ORDER#17", "SK": "LINE#9999"}, {"amount": Decimal("2")}
    )
    records = stack.records()
    assert len(records) == 2
    for record in records:  # the transaction split by the batch boundary
        stack.deliver([record])
    stack.settle()
    assert stack.alerts() == []
    assert stack.audit.log.findings() == []


def test_above_parallelization_factor_one_a_large_order_is_recounted_not_carried(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent batches of one shard may fold a collection's records out of order: the
    carry would skip a record as folded before, so every unbalanced group is recounted."""
    order_with_lines(stack, 101)
    monkeypatch.setenv("PARALLELIZATION_FACTOR", "2")
    settings.cache_clear()
    assert runtime.reconciler().carrying is False
    stack.put({"PK": "ORDER#17", "SK": "LINE#9999", "amount": Decimal("10.5")})
    stack.pump()
    [alert] = stack.alerts()
    assert alert["kind"] == "drift"
