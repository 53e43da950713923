"""Counters kept by a stream aggregator (``lag_seconds``), on DynamoDB Local's real stream.

The cart writers only write their products; a real aggregator handler (tests/harness) reads
the same stream records and ADDs each batch's quantity deltas to the cart's total, late or
twice as the test decides. moto's SQS runs in this process, so its clock is held and moved
by hand: a recheck comes due exactly when the test says the lag has passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import moto.sqs.models
import pytest
from moto.core.utils import unix_time_millis

from tally.core.settings import settings
from tally.reconciler import runtime
from tally.rules import SumRule, load_rules
from tests.harness.aggregator import Aggregator
from tests.integration.conftest import Stack

# The rule docs/adopting.md gives for this aggregator, as the functions would bundle it.
CARTS_RULES = Path(__file__).resolve().parents[2] / "examples" / "adopting" / "carts" / "rules.toml"
RULE = load_rules(CARTS_RULES)["cart-quantity"]
assert isinstance(RULE, SumRule) and RULE.lag_seconds is not None
LAG = RULE.lag_seconds


class HeldClock:
    """moto's SQS clock, standing still until the test moves it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.now = unix_time_millis()
        monkeypatch.setattr(moto.sqs.models, "unix_time_millis", lambda: self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds * 1000


@dataclass
class Carts:
    """The cart table's writers, its aggregator and the reconciler, each fed by hand."""

    stack: Stack
    clock: HeldClock
    aggregator: Aggregator

    def put(self, cart: str, product: str, quantity: int) -> None:
        self.stack.put({"PK": cart, "SK": f"PRODUCT#{product}", "quantity": quantity})

    def remove(self, cart: str, product: str) -> None:
        self.stack.delete(cart, f"PRODUCT#{product}")

    def total(self, cart: str) -> Any:
        item = self.stack.item(cart, "TOTAL")
        return None if item is None else item.get("quantity")

    def truth(self, cart: str) -> Decimal:
        items = self.stack.dynamodb.query(
            TableName=self.stack.table,
            KeyConditionExpression="PK = :pk AND begins_with(SK, :p)",
            ExpressionAttributeValues={":pk": {"S": cart}, ":p": {"S": "PRODUCT#"}},
            ConsistentRead=True,
        )["Items"]
        return sum((Decimal(i["quantity"]["N"]) for i in items), Decimal(0))

    def reconcile(self, records: list[dict[str, Any]]) -> None:
        assert self.stack.deliver(records) == {"batchItemFailures": []}

    def aggregate(self, records: list[dict[str, Any]]) -> None:
        self.aggregator.handler({"Records": records})

    def in_step(self) -> None:
        """Both consumers take every record at once, until the stream is quiet."""
        while records := self.stack.records():
            self.aggregate(records)
            self.reconcile(records)

    def lag_passes(self) -> int:
        """The lag (and a second) goes by: every recheck due runs; returns how many."""
        self.clock.advance(LAG + 1)
        return self.stack.run_rechecks()

    def settle(self) -> None:
        """Stream and rechecks until both are quiet (a recheck may schedule another)."""
        for _ in range(10):
            self.in_step()
            if not self.lag_passes() and not self.stack.pending_rechecks():
                return
        raise AssertionError("the rechecks never went quiet")


@pytest.fixture
def carts(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Carts]:
    monkeypatch.setenv("RULES_FILE", str(CARTS_RULES))
    settings.cache_clear()
    runtime.rules.cache_clear()
    aggregator = Aggregator(
        stack.dynamodb,
        stack.table,
        children="PRODUCT#",
        parent_sk="TOTAL",
        counter="quantity",
        summed="quantity",
    )
    yield Carts(stack, HeldClock(monkeypatch), aggregator)


def shopping(carts: Carts) -> None:
    """Three carts filled, their totals kept by the aggregator in step."""
    for cart, products in (("CART#1", "abc"), ("CART#2", "ab"), ("CART#3", "a")):
        for n, product in enumerate(products, start=1):
            carts.put(cart, product, n)
    carts.settle()
    assert [carts.total(c) for c in ("CART#1", "CART#2", "CART#3")] == [6, 3, 1]
    assert carts.stack.alerts() == []


def test_a_late_and_redelivered_aggregator_raises_nothing(carts: Carts) -> None:
    shopping(carts)
    carts.put("CART#1", "a", 5)  # 1 -> 5
    carts.remove("CART#1", "b")
    carts.put("CART#2", "d", 4)
    for product in "xy":  # a new cart: its products are ahead of its total's first write
        carts.put("CART#9", product, 2)
    records = carts.stack.records()
    carts.reconcile(records)
    carts.reconcile(records)  # Lambda redelivers the batch to the reconciler
    assert carts.stack.alerts() == [] and carts.total("CART#9") is None

    carts.clock.advance(LAG - 1)
    assert carts.stack.run_rechecks() == 0  # nothing is judged within the lag
    carts.aggregate(records)  # the aggregator's 60 s batching window closes
    carts.reconcile(carts.stack.records())
    assert carts.lag_passes() > 0
    carts.settle()

    assert carts.stack.alerts() == []
    assert carts.stack.audit.log.findings() == []
    for cart in ("CART#1", "CART#2", "CART#9"):
        assert carts.total(cart) == carts.truth(cart)
    assert [carts.total(c) for c in ("CART#1", "CART#2", "CART#9")] == [8, 7, 4]


def test_an_aggregator_later_than_its_lag_is_not_judged_on_one_recount(carts: Carts) -> None:
    shopping(carts)
    carts.put("CART#2", "z", 10)
    records = carts.stack.records()
    carts.reconcile(records)
    assert carts.lag_passes() == 1  # first recount: off by the pending 10
    assert carts.stack.alerts() == []
    carts.aggregate(records)  # lands after the first recount, before the second
    carts.settle()
    assert carts.stack.alerts() == []
    assert carts.total("CART#2") == 13


def test_an_aggregator_applying_a_redelivered_batch_twice_is_drift_after_the_lag(
    carts: Carts,
) -> None:
    shopping(carts)
    carts.put("CART#1", "d", 4)
    records = carts.stack.records()
    carts.reconcile(records)
    carts.aggregate(records)
    carts.aggregate(records)  # its own redelivery, added again
    carts.reconcile(carts.stack.records())
    carts.lag_passes()
    assert carts.stack.alerts() == []  # one recount is no finding: the offset must hold
    carts.settle()

    [alert] = carts.stack.alerts()
    assert (alert["kind"], alert["rule"], alert["key"]) == (
        "drift",
        "cart-quantity",
        {"PK": "CART#1", "SK": "TOTAL"},
    )
    assert (alert["stored"], alert["actual"]) == (14, 10)
    assert alert["repair"]["status"] == "skipped"
    assert "aggregator" in alert["repair"]["reason"]
    assert carts.total("CART#1") == 14  # never repaired under the aggregator


def test_a_rogue_overwrite_of_an_aggregated_total_is_drift_never_repaired(carts: Carts) -> None:
    shopping(carts)
    carts.stack.dynamodb.update_item(
        TableName=carts.stack.table,
        Key={"PK": {"S": "CART#2"}, "SK": {"S": "TOTAL"}},
        UpdateExpression="SET quantity = :v",
        ExpressionAttributeValues={":v": {"N": "0"}},
    )
    carts.put("CART#2", "c", 3)  # the aggregator carries on after the overwrite
    carts.settle()

    [alert] = carts.stack.alerts()
    assert (alert["kind"], alert["key"]["PK"]) == ("drift", "CART#2")
    assert (alert["stored"], alert["actual"]) == (3, 6)
    assert carts.total("CART#2") == 3
    carts.put("CART#2", "e", 1)  # more traffic on the same standing drift: no second alert
    carts.settle()
    assert carts.stack.alerts() == []


def test_a_lost_aggregator_batch_is_drift_or_orphans_after_the_lag(carts: Carts) -> None:
    shopping(carts)
    carts.put("CART#3", "b", 2)
    carts.put("CART#7", "a", 5)  # a new cart whose total the lost batch would have created
    carts.reconcile(carts.stack.records())  # the aggregator never gets these records
    carts.lag_passes()
    assert carts.stack.alerts() == []
    carts.settle()

    alerts = sorted(carts.stack.alerts(), key=lambda a: str(a["key"]["PK"]))
    assert [(a["kind"], a["key"]["PK"], a["stored"], a["actual"]) for a in alerts] == [
        ("drift", "CART#3", 1, 3),
        ("orphans", "CART#7", None, 1),
    ]
    assert {a["repair"]["status"] for a in alerts} == {"skipped"}
