"""A product's quantity across every cart (docs/adopting.md), on DynamoDB Local's real stream.

aws-samples' serverless shopping cart as written: cart lines ``pk = cart#<id>`` (or
``user#<sub>``), ``sk = product#<id>``, and its stream handler, which sums each batch's
quantity deltas per ``sk`` and ADDs them to ``pk = product#<id>, sk = totalquantity`` with no
idempotency (``tests/harness/aggregator.py`` in that shape), fed late and redelivered. The
lines of a product sit in every cart's collection; the rule finds them through the inverted
index ``ProductCarts`` of ``examples/adopting/products``. moto's SQS clock is held: a recheck
comes due exactly when the test moves it past the lag.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tally.core.streams import StreamReader, stream_arn
from tally.local.template import create_table, load_template
from tally.rules import SumRule, load_rules
from tests.harness.aggregator import Aggregator
from tests.integration.conftest import Stack, _clear_caches
from tests.integration.test_aggregated_counters import HeldClock
from tests.utils import lambda_context, serialize

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "adopting" / "products"
RULE = load_rules(EXAMPLE / "rules.toml")["product-quantity"]
assert isinstance(RULE, SumRule) and RULE.lag_seconds is not None and RULE.through is not None
LAG = RULE.lag_seconds
TTL = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}


@dataclass
class Shop:
    stack: Stack
    clock: HeldClock
    aggregator: Aggregator

    def line(self, cart: str, product: str, quantity: int) -> None:
        item = {"pk": cart, "sk": f"product#{product}", "quantity": quantity}
        self.stack.dynamodb.put_item(TableName=self.stack.table, Item=serialize(item))

    def total(self, product: str) -> Any:
        response = self.stack.dynamodb.get_item(
            TableName=self.stack.table,
            Key=serialize({"pk": f"product#{product}", "sk": "totalquantity"}),
            ConsistentRead=True,
        )
        return Decimal(response["Item"]["quantity"]["N"]) if "Item" in response else None

    def reconcile(self, records: list[dict[str, Any]]) -> None:
        assert self.stack.deliver(records) == {"batchItemFailures": []}

    def in_step(self) -> None:
        while records := self.stack.records():
            self.aggregator.handler({"Records": records}, lambda_context())
            self.reconcile(records)

    def settle(self) -> None:
        for _ in range(10):
            self.in_step()
            self.clock.advance(LAG + 1)
            if not self.stack.run_rechecks() and not self.stack.pending_rechecks():
                return
        raise AssertionError("the rechecks never went quiet")


@pytest.fixture
def shop(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    name = f"tally-products-{uuid.uuid4().hex[:10]}"
    create_table(
        stack.dynamodb, load_template(EXAMPLE / "template.yaml"), "ShoppingCartTable", name
    )
    monkeypatch.setenv("TABLE_NAME", name)
    monkeypatch.setenv("RULES_FILE", str(EXAMPLE / "rules.toml"))
    _clear_caches()
    stack.table = name
    stack.reader = StreamReader(stack.reader._client, stream_arn(stack.dynamodb, name))
    aggregator = Aggregator(
        stack.dynamodb,
        name,
        children="product#",
        parent_sk="totalquantity",
        counter="quantity",
        summed="quantity",
        partition_key="pk",
        sort_key="sk",
        parent_named_by="sk",
    )
    yield Shop(stack, HeldClock(monkeypatch), aggregator)
    stack.dynamodb.delete_table(TableName=name)


def shopping(shop: Shop) -> None:
    """Three carts (one signed in) hold lines of two products, totals kept in step."""
    for cart, product, quantity in (
        ("cart#1", "a", 2),
        ("cart#2", "a", 3),
        ("user#u1", "a", 1),
        ("cart#1", "b", 5),
    ):
        shop.line(cart, product, quantity)
    shop.settle()
    assert (shop.total("a"), shop.total("b")) == (6, 5)
    assert shop.stack.alerts() == []


def test_late_redelivered_and_expired_carts_raise_nothing(shop: Shop) -> None:
    shopping(shop)
    shop.line("cart#2", "a", 7)  # 3 -> 7
    shop.line("cart#3", "b", 1)
    records = shop.stack.records()
    shop.reconcile(records)
    shop.reconcile(records)  # Lambda redelivers the batch to the reconciler
    shop.clock.advance(LAG - 1)
    assert shop.stack.run_rechecks() == 0  # nothing is judged within the lag
    shop.aggregator.handler({"Records": records})  # its batching window closes late
    # A cart expires: TTL removes its line, and the aggregator subtracts it like any removal.
    shop.stack.dynamodb.delete_item(
        TableName=shop.stack.table, Key=serialize({"pk": "cart#1", "sk": "product#a"})
    )
    expired = shop.stack.records()
    for record in expired:
        record["userIdentity"] = TTL
    shop.aggregator.handler({"Records": expired})
    shop.reconcile(expired)
    shop.settle()
    assert shop.stack.alerts() == []
    assert (shop.total("a"), shop.total("b")) == (8, 6)


def test_a_batch_added_twice_and_a_lost_one_are_drift_a_lag_later_never_repaired(
    shop: Shop,
) -> None:
    shopping(shop)
    shop.line("cart#2", "a", 4)  # 3 -> 4: +1
    twice = shop.stack.records()
    for _ in range(2):  # the sample's handler, redelivered: ADD +1 twice
        shop.aggregator.handler({"Records": twice})
    shop.reconcile(twice)
    shop.line("cart#9", "b", 2)  # a batch the aggregator never got
    shop.reconcile(shop.stack.records())
    shop.clock.advance(LAG + 1)
    shop.stack.run_rechecks()
    assert shop.stack.alerts() == []  # one look is no finding: the lag may still be running
    shop.settle()
    found = sorted(
        (a["kind"], a["key"]["pk"], a["stored"], a["actual"], a["repair"]["status"])
        for a in shop.stack.alerts()
    )
    assert found == [
        ("drift", "product#a", 8, 7, "skipped"),
        ("drift", "product#b", 5, 7, "skipped"),
    ]
    assert (shop.total("a"), shop.total("b")) == (8, 5)  # nothing written


def test_a_products_changes_before_its_look_comes_due_share_that_look_and_a_fault_among_them_is_found(  # noqa: E501
    shop: Shop,
) -> None:
    shopping(shop)
    shop.line("cart#1", "a", 3)  # 2 -> 3: the aggregator adds it
    shop.in_step()
    assert shop.stack.pending_rechecks() == 1  # a look at product a, a lag from now
    shop.clock.advance(LAG - 2)  # before that look can have read anything
    shop.line("cart#2", "a", 5)  # 3 -> 5, never aggregated: drift of -2
    shop.reconcile(shop.stack.records())
    shop.line("user#u1", "a", 2)  # 1 -> 2, aggregated
    shop.in_step()
    assert shop.stack.pending_rechecks() == 1  # both batches ride on the look on its way
    shop.settle()
    found = [(a["kind"], a["key"]["pk"], a["stored"], a["actual"]) for a in shop.stack.alerts()]
    assert found == [("drift", "product#a", 8, 10)]
    assert shop.total("a") == 8  # alerted, never written


def test_a_change_seen_when_the_look_on_its_way_may_have_begun_sends_a_look_of_its_own(
    shop: Shop,
) -> None:
    shopping(shop)
    shop.line("cart#1", "b", 6)  # 5 -> 6, aggregated
    shop.in_step()
    assert shop.stack.pending_rechecks() == 1
    shop.clock.advance(LAG)  # the look is due: it may be reading the table now
    shop.line("cart#4", "b", 1)  # never aggregated: drift of -1
    shop.reconcile(shop.stack.records())
    assert shop.stack.pending_rechecks() == 2  # that look may not see it: one of its own
    assert shop.stack.run_rechecks() == 1  # the first look; the second is not due yet
    shop.settle()
    found = [(a["kind"], a["key"]["pk"], a["stored"], a["actual"]) for a in shop.stack.alerts()]
    assert found == [("drift", "product#b", 6, 7)]
