"""Children found through an index whose index lags far more than the grace.

The index here never catches up within the test: an entry the test hides stays hidden at
every look, and a stale one stays stale (``LaggingIndex`` of test_index_children.py). What
the stream delivered must still be counted: a rogue write behind the counter's back is
alerted once and repaired, and a legitimate write the index does not show yet never makes a
repair short. Each case runs with the stream read whole (a transaction's halves together)
and one record per batch (its halves apart, as split shards deliver them).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.integration import test_index_children
from tests.integration.test_index_children import GRACE, Followers, kinds, line
from tests.utils import serialize

followers = test_index_children.followers  # the fixture

BATCHES = pytest.mark.parametrize("batch_size", [100, 1], ids=["whole", "split"])


def settle(followers: Followers, batch_size: int) -> None:
    """The stream (``batch_size`` records a batch), then every look, until quiet."""
    for _ in range(12):
        while followers.stack.pump(batch_size=batch_size):
            pass
        followers.clock.advance(GRACE + 1)
        if not followers.stack.run_rechecks() and not followers.stack.pending_rechecks():
            return
    raise AssertionError("the rechecks never went quiet")


def profile_key(user: str) -> dict[str, Any]:
    return serialize({"PK": f"USER#{user}", "SK": "PROFILE"})


def ann_with_two_followers(followers: Followers) -> None:
    followers.profile("ann")
    followers.follow("dan", "ann")
    followers.follow("eve", "ann")
    settle(followers, 100)
    assert followers.stack.alerts() == []


@BATCHES
def test_an_edge_without_its_count_is_found_while_the_index_never_shows_it(
    followers: Followers, batch_size: int
) -> None:
    ann_with_two_followers(followers)
    followers.stack.put(followers.edge("fay", "ann"))  # no count for it
    followers.lag.hidden.append({"PK": "USER#fay", "SK": "FOLLOWS#ann"})
    settle(followers, batch_size)
    assert kinds(followers.stack.alerts()) == [("drift", "USER#ann", "applied")]
    assert followers.count("ann") == 3


@BATCHES
def test_an_edge_deleted_without_its_decrement_is_found_while_the_index_still_shows_it(
    followers: Followers, batch_size: int
) -> None:
    ann_with_two_followers(followers)
    gone = followers.edge("eve", "ann")
    followers.stack.delete("USER#eve", "FOLLOWS#ann")
    followers.lag.stale.append(gone)
    settle(followers, batch_size)
    assert kinds(followers.stack.alerts()) == [("drift", "USER#ann", "applied")]
    assert followers.count("ann") == 1


@BATCHES
def test_an_edge_moved_or_blocked_behind_the_counts_back_is_found_on_both_parents(
    followers: Followers, batch_size: int
) -> None:
    ann_with_two_followers(followers)
    followers.profile("bob")
    settle(followers, 100)
    # dan's edge re-pointed to bob, eve's blocked: no counter moved, the index shows neither.
    moved = followers.edge("dan", "bob") | {"SK": "FOLLOWS#ann"}
    followers.stack.put(moved)
    followers.stack.put(followers.edge("eve", "ann", status="BLOCKED#"))
    followers.lag.stale += [
        followers.edge("dan", "ann") | {"SK": "FOLLOWS#ann"},
        followers.edge("eve", "ann"),
    ]
    followers.lag.hidden.append({"PK": "USER#dan", "SK": "FOLLOWS#ann"})
    settle(followers, batch_size)
    assert kinds(followers.stack.alerts()) == [
        ("drift", "USER#ann", "applied"),
        ("drift", "USER#bob", "applied"),
    ]
    assert [followers.count(u) for u in ("ann", "bob")] == [0, 1]


@BATCHES
def test_a_rogue_bump_after_a_follow_the_index_never_shows_is_repaired_to_the_truth(
    followers: Followers, batch_size: int
) -> None:
    """The counter is 3 + 3 rogue; the index shows 2 edges of the 3: a repair to 2 would be
    a harmful write. The stream delivered the third: the repair sets 3."""
    ann_with_two_followers(followers)
    followers.follow("fay", "ann")
    followers.lag.hidden.append({"PK": "USER#fay", "SK": "FOLLOWS#ann"})
    followers.stack.dynamodb.update_item(
        TableName=followers.stack.table,
        Key=profile_key("ann"),
        UpdateExpression="ADD followerCount :k",
        ExpressionAttributeValues=serialize({":k": 3}),
    )
    settle(followers, batch_size)
    (alert,) = followers.stack.alerts()
    assert (alert["kind"], alert["repair"]["status"]) == ("drift", "applied")
    assert (Decimal(str(alert["stored"])), Decimal(str(alert["actual"]))) == (6, 3)
    assert followers.count("ann") == 3
    assert [(r["before"], r["after"]) for r in followers.stack.audit.log.repairs()] == [(6, 3)]


def a_follow_and_a_rogue_edge_the_index_never_shows(followers: Followers) -> None:
    ann_with_two_followers(followers)
    followers.follow("fay", "ann")
    followers.stack.put(followers.edge("gus", "ann"))  # no count for it
    followers.lag.hidden += [
        {"PK": "USER#fay", "SK": "FOLLOWS#ann"},
        {"PK": "USER#gus", "SK": "FOLLOWS#ann"},
    ]


@BATCHES
def test_a_fault_is_not_hidden_by_a_legitimate_follow_the_index_never_shows(
    followers: Followers, batch_size: int
) -> None:
    """A follow the index does not show, then a rogue edge it does not show either: counter
    and index each miss one edge, and agree. The stream delivered both."""
    a_follow_and_a_rogue_edge_the_index_never_shows(followers)
    settle(followers, batch_size)
    assert kinds(followers.stack.alerts()) == [("drift", "USER#ann", "applied")]
    assert followers.count("ann") == 4


@BATCHES
def test_transactional_writes_the_index_never_shows_raise_nothing_and_write_nothing(
    followers: Followers, batch_size: int
) -> None:
    ann_with_two_followers(followers)
    followers.profile("bob")
    followers.follow("fay", "ann")
    followers.unfollow("dan", "ann")
    moved = followers.edge("eve", "bob") | {"SK": "FOLLOWS#ann"}
    followers.transact(
        followers.put_edge(moved), followers.bump("ann", -1), followers.bump("bob", 1)
    )
    followers.lag.hidden += [
        {"PK": "USER#fay", "SK": "FOLLOWS#ann"},
        {"PK": "USER#eve", "SK": "FOLLOWS#ann"},
    ]
    followers.lag.stale += [followers.edge("dan", "ann"), followers.edge("eve", "ann")]
    settle(followers, batch_size)
    assert followers.stack.alerts() == []
    assert followers.stack.audit.log.repairs() == []
    assert [followers.count(u) for u in ("ann", "bob")] == [1, 1]


def product_total(followers: Followers, quantity: int) -> dict[str, Any]:
    return {
        "Update": {
            "TableName": followers.stack.table,
            "Key": serialize({"PK": "PRODUCT#p", "SK": "TOTAL"}),
            "UpdateExpression": "ADD quantity :q",
            "ExpressionAttributeValues": serialize({":q": quantity}),
        }
    }


def product_with_two_lines(followers: Followers) -> None:
    followers.stack.put({"PK": "PRODUCT#p", "SK": "TOTAL", "quantity": 0})
    for cart, quantity in (("1", 2), ("2", 3)):
        followers.transact(
            followers.put_edge(line(cart, "p", quantity)), product_total(followers, quantity)
        )
    settle(followers, 100)
    assert followers.stack.alerts() == []


def drift_of_p(followers: Followers) -> tuple[Decimal, Decimal]:
    (alert,) = followers.stack.alerts()
    assert (alert["kind"], alert["key"]["PK"]) == ("drift", "PRODUCT#p")
    return Decimal(str(alert["stored"])), Decimal(str(alert["actual"]))


@BATCHES
def test_a_cart_line_changed_or_deleted_without_its_total_is_found_behind_a_stale_index(
    followers: Followers, batch_size: int
) -> None:
    product_with_two_lines(followers)
    followers.stack.put(line("1", "p", 7))  # 2 -> 7, the total not told
    followers.stack.delete("CART#2", "PRODUCT#p")  # 3 gone, the total not told
    followers.lag.stale += [line("1", "p", 2), line("2", "p", 3)]
    followers.lag.hidden.append({"PK": "CART#1", "SK": "PRODUCT#p"})
    settle(followers, batch_size)
    assert drift_of_p(followers) == (5, 7)


@BATCHES
def test_a_rogue_total_after_a_line_the_index_never_shows_is_judged_on_every_line(
    followers: Followers, batch_size: int
) -> None:
    product_with_two_lines(followers)
    followers.transact(followers.put_edge(line("3", "p", 1)), product_total(followers, 1))
    followers.lag.hidden.append({"PK": "CART#3", "SK": "PRODUCT#p"})
    followers.stack.dynamodb.update_item(
        TableName=followers.stack.table,
        Key=serialize({"PK": "PRODUCT#p", "SK": "TOTAL"}),
        UpdateExpression="SET quantity = :q",
        ExpressionAttributeValues=serialize({":q": 9}),
    )
    settle(followers, batch_size)
    assert drift_of_p(followers) == (9, 6)


@pytest.mark.parametrize(
    "amount", ["1E+40", "-9.99E+125", "1E-130", "12345678901234567890123456789012345678"]
)
def test_a_line_of_any_amount_dynamodb_holds_is_noted_judged_and_blocks_nothing(
    followers: Followers, amount: str
) -> None:
    """A cart line written behind the total's back with an amount no writer of the rule
    stores, but DynamoDB does: its batch is noted (the stream's window) and verified, never
    retried for ever, and its parent is judged (alerted, never repaired: the rule alerts)."""
    product_with_two_lines(followers)
    followers.stack.dynamodb.put_item(
        TableName=followers.stack.table,
        Item={
            "PK": {"S": "CART#9"},
            "SK": {"S": "PRODUCT#p"},
            "quantity": {"N": amount},
        },
    )
    followers.lag.hidden.append({"PK": "CART#9", "SK": "PRODUCT#p"})
    assert followers.stack.pump_retrying() == 1  # one record, delivered once, not failed
    settle(followers, 100)
    (alert,) = followers.stack.alerts()
    assert alert["key"]["PK"] == "PRODUCT#p" and alert["repair"]["status"] == "skipped"
    assert followers.stack.item("PRODUCT#p", "TOTAL") == {
        "PK": "PRODUCT#p",
        "SK": "TOTAL",
        "quantity": 5,
    }


def test_a_child_whose_key_is_as_long_as_dynamodb_allows_is_noted_and_judged(
    followers: Followers,
) -> None:
    """A follower's key of 200 'é' (405 bytes, 1,200 as escaped JSON) names a note too long
    for a sort key as it stands: it is noted by a digest instead, never a batch that fails
    for ever, and the rogue edge it is is found."""
    ann_with_two_followers(followers)
    long = "é" * 200
    followers.stack.put(followers.edge(long, "ann"))  # no count for it
    followers.lag.hidden.append({"PK": f"USER#{long}", "SK": "FOLLOWS#ann"})
    assert followers.stack.pump_retrying() == 1
    settle(followers, 100)
    assert kinds(followers.stack.alerts()) == [("drift", "USER#ann", "applied")]
    assert followers.count("ann") == 3


def look_between_halves(followers: Followers, pk: str, looks: int = 1) -> None:
    """A batch boundary inside a transaction: the record of the item at ``pk`` delivered
    alone, the ``looks`` it sends a grace later (which find nothing, so far), then the
    other two records in one batch."""
    records = followers.stack.records()
    first = [r for r in records if r["dynamodb"]["Keys"]["PK"]["S"] == pk]
    rest = [r for r in records if r not in first]
    assert len(first) == 1 and len(rest) == 2
    followers.stack.deliver(first)
    followers.clock.advance(GRACE + 1)
    assert followers.stack.run_rechecks() == looks
    assert followers.stack.alerts() == []
    followers.stack.deliver(rest)


def test_a_rogue_delete_that_balances_another_transactions_half_is_found(
    followers: Followers,
) -> None:
    """Lambda's batches end anywhere: an unfollow's edge record ends one batch, its count's
    opens the next beside a rogue delete of another edge, and that batch balances by chance
    (-1 and -1). The unfollow's look came between, with the index still showing the deleted
    edge and no record of its deletion delivered: it found the parent consistent. The
    balanced batch must not prove itself: its rogue half is looked at."""
    ann_with_two_followers(followers)
    followers.unfollow("dan", "ann")
    followers.stack.delete("USER#eve", "FOLLOWS#ann")
    followers.lag.stale.append(followers.edge("eve", "ann"))
    look_between_halves(followers, "USER#dan")  # the unfollow's look: consistent, so far
    settle(followers, 100)
    assert kinds(followers.stack.alerts()) == [("drift", "USER#ann", "applied")]
    assert followers.count("ann") == 0


def test_a_rogue_edge_that_balances_another_follows_count_is_found(followers: Followers) -> None:
    """The same with a rogue edge put (+1) beside a follow's count (+1) whose edge closed the
    batch before, the index showing neither new edge: the follow's look found the counter
    at 3 and three edges (two indexed, one noted), and the balanced batch hid the fourth."""
    a_follow_and_a_rogue_edge_the_index_never_shows(followers)
    look_between_halves(followers, "USER#fay")  # the follow's look: consistent, so far
    settle(followers, 100)
    assert kinds(followers.stack.alerts()) == [("drift", "USER#ann", "applied")]
    assert followers.count("ann") == 4
