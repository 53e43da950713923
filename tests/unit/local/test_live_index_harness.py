"""The live index scenario's own parts (tests/harness/live_index.py): the cart aggregator it
judges product totals by, and how it tells the reconciler's reads and writes apart."""

from __future__ import annotations

from typing import Any

from tests.harness.live_index import CartAggregator, hot_repairs_harmful, rule_of, written_keys
from tests.utils import deserialize, stream_record


class Recorder:
    """A DynamoDB client that keeps the aggregator's ADDs."""

    def __init__(self) -> None:
        self.adds: list[tuple[str, int]] = []

    def update_item(self, **kwargs: Any) -> None:
        key = deserialize(kwargs["Key"])
        self.adds.append((key["pk"], int(kwargs["ExpressionAttributeValues"][":d"]["N"])))


def line(cart: str, product: str, new: int | None, old: int | None) -> dict[str, Any]:
    event = "INSERT" if old is None else "REMOVE" if new is None else "MODIFY"
    return stream_record(
        event,
        {"pk": cart, "sk": product},
        None if new is None else {"quantity": new},
        None if old is None else {"quantity": old},
    )


def test_the_aggregator_adds_each_batch_deltas_per_product_late_and_in_order() -> None:
    db = Recorder()
    aggregator = CartAggregator(db, "t", seed=1, late=(0.5, 1.0))
    aggregator.observe(
        [
            line("cart#a", "product#1", 3, None),
            line("cart#b", "product#1", 1, 4),
            line("cart#a", "product#2", None, 2),
            line("cart#a", "product#3", 5, 5),  # no change: nothing to add
            stream_record("MODIFY", {"pk": "product#1", "sk": "totalquantity"}, {"quantity": 9}),
        ],
        seen=100.0,
    )
    aggregator.observe([line("cart#c", "product#2", 1, None)], seen=100.1)
    aggregator.step(100.4)
    assert db.adds == []  # not yet: it runs late
    aggregator.step(102.0)
    assert db.adds == [("product#2", -2), ("product#2", 1)]  # product#1 nets to 0
    assert aggregator.faults == [] and aggregator.wait_idle(0)


def test_a_redelivered_batch_is_added_twice_once_per_product_and_each_is_a_fault() -> None:
    db = Recorder()
    aggregator = CartAggregator(db, "t", seed=1, late=(0.0, 0.0))
    aggregator.redeliver(2)
    aggregator.observe([line("cart#a", "product#1", 2, None)], seen=1.0)
    aggregator.observe([line("cart#a", "product#1", 3, 2)], seen=2.0)  # already broken: once
    aggregator.observe([line("cart#b", "product#2", 4, None)], seen=3.0)
    aggregator.step(10.0)
    assert db.adds == [
        ("product#1", 2),
        ("product#1", 2),
        ("product#1", 1),
        ("product#2", 4),
        ("product#2", 4),
    ]
    assert [(f.pk, f.kind) for f in aggregator.faults] == [
        ("product#1", "sum/redelivered"),
        ("product#2", "sum/redelivered"),
    ]
    assert aggregator.broken == {"product#1", "product#2"}


def test_reads_are_put_to_the_rule_they_serve() -> None:
    assert rule_of("Query", {"IndexName": "GSI1"}) == "followers"
    assert rule_of("Query", {"IndexName": "ByProduct"}) == "products"
    assert (
        rule_of("GetItem", {"Key": {"pk": {"S": "USER#f01"}, "sk": {"S": "PROFILE"}}})
        == "followers"
    )
    assert (
        rule_of("GetItem", {"Key": {"pk": {"S": "cart#1"}, "sk": {"S": "product#1"}}}) == "products"
    )


def test_writes_on_the_table_are_found_in_every_write_shape() -> None:
    key = {"pk": {"S": "USER#f01"}, "sk": {"S": "PROFILE"}}
    other = {"TableName": "audit", "Item": {"pk": {"S": "x"}, "sk": {"S": "y"}}}
    assert written_keys("UpdateItem", {"TableName": "t", "Key": key}, "t") == [
        ("USER#f01", "PROFILE")
    ]
    assert written_keys("PutItem", other, "t") == []
    transact = {"TransactItems": [{"Update": {"TableName": "t", "Key": key}}, {"Put": other}]}
    assert written_keys("TransactWriteItems", transact, "t") == [("USER#f01", "PROFILE")]
    batch = {"RequestItems": {"t": [{"DeleteRequest": {"Key": key}}], "audit": []}}
    assert written_keys("BatchWriteItem", batch, "t") == [("USER#f01", "PROFILE")]


def test_repairs_of_the_hot_followee_are_judged_by_the_faults_they_mend_in_order() -> None:
    """Each applied repair must mend every fault up to a later one than the repair before:
    +5 then -1 mends the faults 5 and -1 one by one, whatever their sum's sign; one repair
    of 4 mends both; anything else, or out of order, is harmful."""
    assert not hot_repairs_harmful([5, -1], [5, -1])
    assert not hot_repairs_harmful([4], [5, -1])
    assert not hot_repairs_harmful([5], [5, -1])  # the second fault is not mended: not harm
    assert not hot_repairs_harmful([], [5, -1])
    assert hot_repairs_harmful([-1, 5], [5, -1])
    assert hot_repairs_harmful([4, 1], [5, -1])  # back to a state no fault left
    assert hot_repairs_harmful([3], [5, -1])
    assert hot_repairs_harmful([5, 0], [5, -1])  # a repair that mends nothing new
