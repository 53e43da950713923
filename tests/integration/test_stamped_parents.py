"""Parents that never rest, counted through an index, with writers that stamp their changes.

The product's writers (``TallyWriter``) write a fresh token on the child and on each parent
they change, ahead of the parent's last tokens (``through.stamp``). A look then judges a
parent at the revision it holds, moving or not, when every change since its reference is
known: the stream's window holds each stamp's child, but the newest, which it reads from the
table. Here the index hides every edge of the last rounds (it lags far more than the grace),
and each round leaves one write in flight while the looks run: the parent never holds still
for a grace. A rogue write is still alerted and repaired while the writes go on, never
repaired short; an outsider's unstamped change is never judged by the stamps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tally.reconciler import runtime
from tally.rules import load_rules
from tally.writers import TallyWriter
from tally.writers.errors import InvalidRequestError
from tests.integration.conftest import Stack
from tests.integration.test_index_children import GRACE, Followers, index_stack, kinds
from tests.integration.test_index_lag_beyond_grace import look_between_halves
from tests.utils import serialize

RULES = Path(__file__).with_name("stamped_index_rules.toml")
BATCHES = pytest.mark.parametrize("batch_size", [100, 1], ids=["whole", "split"])


@pytest.fixture
def stamped(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Followers]:
    yield from index_stack(stack, monkeypatch, RULES)


def writer(followers: Followers) -> TallyWriter:
    return TallyWriter(followers.stack.dynamodb, followers.stack.table, load_rules(RULES))


def edge_key(follower: str, followee: str) -> dict[str, str]:
    return {"PK": f"USER#{follower}", "SK": f"FOLLOWS#{followee}"}


def follow(write: TallyWriter, follower: str, followee: str) -> None:
    attributes = {"GSI1PK": f"USER#{followee}", "GSI1SK": "FOLLOWING#2026-11-27"}
    assert write.add_child(edge_key(follower, followee), attributes).outcome == "created"


def drain(followers: Followers, batch_size: int) -> None:
    while followers.stack.pump(batch_size=batch_size):
        pass


def look(followers: Followers) -> list[dict[str, Any]]:
    """A grace later, every look that is due; the alerts they sent."""
    followers.clock.advance(GRACE + 1)
    followers.stack.run_rechecks()
    return followers.stack.alerts()


def settle(followers: Followers, batch_size: int) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = []
    for _ in range(12):
        drain(followers, batch_size)
        alerts += look(followers)
        if not followers.stack.pending_rechecks():
            return alerts
    raise AssertionError("the rechecks never went quiet")


def deliver_all_but(followers: Followers, pk: str) -> list[dict[str, Any]]:
    """Split shards, one lagging: every record delivered (one a batch) but the one of the
    item at ``pk``, which is returned, held back."""
    records = followers.stack.records()
    held = [r for r in records if r["dynamodb"]["Keys"]["PK"]["S"] == pk]
    assert len(held) == 1
    for record in records:
        if record not in held:
            followers.stack.deliver([record])
    return held


def rogue_add(followers: Followers, key: dict[str, str], attribute: str, delta: int) -> None:
    followers.stack.dynamodb.update_item(
        TableName=followers.stack.table,
        Key=serialize(key),
        UpdateExpression="ADD #a :d",
        ExpressionAttributeNames={"#a": attribute},
        ExpressionAttributeValues=serialize({":d": delta}),
    )


def test_the_writers_stamp_the_child_and_keep_the_parents_last_tokens_newest_first(
    stamped: Followers,
) -> None:
    stamped.profile("ann")
    stamped.profile("bob")
    write = writer(stamped)
    for n in range(10):
        follow(write, f"u{n}", "ann")
    tokens = [stamped.stack.item(f"USER#u{n}", "FOLLOWS#ann")["tallyStamp"] for n in range(10)]
    assert len(set(tokens)) == 10 and all(len(t) == 24 for t in tokens)
    ann = stamped.stack.item("USER#ann", "PROFILE")
    assert [ann[f"tallyStamp{i}"] for i in range(8)] == tokens[::-1][:8]
    assert "tallyStamp8" not in ann  # eight kept, the oldest two dropped
    assert json.loads(ann["tallyStampChild"]) == edge_key("u9", "ann")
    assert ann["followerCount"] == 10 and ann["rev"] == 10 and ann["tallyStampTotal"] == 10

    write.remove_child(edge_key("u9", "ann"))
    ann = stamped.stack.item("USER#ann", "PROFILE")
    assert [ann["tallyStamp0"], ann["tallyStamp1"]] == [f"-{tokens[9]}", tokens[9]]
    assert ann["tallyStampTotal"] == 9

    write.move_child(edge_key("u8", "ann"), {"GSI1PK": "USER#bob"})
    moved = stamped.stack.item("USER#u8", "FOLLOWS#ann")["tallyStamp"]
    ann, bob = (stamped.stack.item(f"USER#{u}", "PROFILE") for u in ("ann", "bob"))
    assert moved not in tokens
    assert (ann["tallyStamp0"], bob["tallyStamp0"]) == (f"-{tokens[8]}", moved)
    assert bob["tallyStamp1"] == "" and json.loads(bob["tallyStampChild"]) == edge_key("u8", "ann")

    with pytest.raises(InvalidRequestError) as refused:
        write.add_child(edge_key("u20", "ann"), {"GSI1PK": "USER#ann", "tallyStamp": "x"})
    assert refused.value.field == ("attributes", "tallyStamp")


@BATCHES
def test_a_parent_written_every_moment_is_repaired_to_the_truth_while_the_writes_go_on(
    stamped: Followers, batch_size: int
) -> None:
    stamped.profile("ann")
    stamped.profile("bob")
    write = writer(stamped)
    following: list[str] = []
    alerted: dict[int, list[dict[str, Any]]] = {}
    for round_ in range(8):
        for n in range(2):
            following.append(f"u{round_}{n}")
            follow(write, following[-1], "ann")
        if round_ == 1:
            write.remove_child(edge_key(following.pop(0), "ann"))
        if round_ == 2:
            rogue_add(stamped, {"PK": "USER#ann", "SK": "PROFILE"}, "followerCount", 3)
        if round_ == 4:
            write.move_child(edge_key(following.pop(0), "ann"), {"GSI1PK": "USER#bob"})
        drain(stamped, batch_size)
        # One more follow, in flight while the looks run: the parent never rests.
        following.append(f"u{round_}x")
        follow(write, following[-1], "ann")
        # The index shows none of the last rounds' edges (far more than a grace behind).
        stamped.lag.hidden = [edge_key(u, "ann") for u in following[-6:]]
        if alerts := look(stamped):
            alerted[round_] = alerts
    assert list(alerted) in ([3], [4]), alerted  # while the writes went on
    (alert,) = next(iter(alerted.values()))
    assert (alert["kind"], alert["key"]["PK"], alert["repair"]["status"]) == (
        "drift",
        "USER#ann",
        "applied",
    )
    assert Decimal(str(alert["stored"])) - Decimal(str(alert["actual"])) == 3
    assert settle(stamped, batch_size) == []
    assert stamped.count("ann") == len(following) and stamped.count("bob") == 1
    (repair,) = stamped.stack.audit.log.repairs()
    assert repair["before"] - repair["after"] == 3


def ann_with_a_rogue_edge(stamped: Followers, batch_size: int) -> TallyWriter:
    """ann followed by dan and eve through the writer, all looked at; then an edge put
    without its count, which the index does not show, delivered. The writer, for more."""
    stamped.profile("ann")
    write = writer(stamped)
    follow(write, "dan", "ann")
    follow(write, "eve", "ann")
    assert settle(stamped, batch_size) == []
    stamped.stack.put(stamped.edge("fay", "ann"))  # no count for it
    stamped.lag.hidden.append(edge_key("fay", "ann"))
    drain(stamped, batch_size)
    return write


@BATCHES
def test_a_fault_on_a_stamped_parent_stands_when_a_second_look_finds_it_off_by_as_much(
    stamped: Followers, batch_size: int
) -> None:
    write = ann_with_a_rogue_edge(stamped, batch_size)
    assert look(stamped) == []  # off by one: looked at again a grace later
    follow(write, "gus", "ann")  # the parent moves in between
    drain(stamped, batch_size)
    assert kinds(look(stamped)) == [("drift", "USER#ann", "applied")]
    assert stamped.count("ann") == 4
    assert settle(stamped, batch_size) == []


@BATCHES
def test_an_outsiders_unstamped_follows_in_flight_are_never_judged_by_the_stamps(
    stamped: Followers, batch_size: int
) -> None:
    """An outsider's transactions bump the revision without a stamp. One in flight at each
    look, its edge hidden by the index and not yet in the window: judged at that revision
    the count would be one short, and a repair harmful. The look waits until it rests."""
    stamped.profile("ann")
    write = writer(stamped)
    following: list[str] = []
    for round_ in range(5):
        following.append(f"s{round_}")
        follow(write, following[-1], "ann")
        drain(stamped, batch_size)
        following.append(f"o{round_}")
        stamped.follow(following[-1], "ann")  # an outsider's transaction, in flight
        stamped.lag.hidden = [edge_key(u, "ann") for u in following[-4:]]
        assert look(stamped) == []
    assert settle(stamped, batch_size) == []
    assert stamped.count("ann") == len(following)
    assert stamped.stack.audit.log.repairs() == []


@BATCHES
def test_a_product_total_changed_every_moment_is_repaired_while_its_lines_change(
    stamped: Followers, batch_size: int
) -> None:
    stamped.stack.put({"PK": "PRODUCT#p", "SK": "TOTAL", "total": 0, "rev": 0})
    write = writer(stamped)
    total = 0
    alerted: dict[int, list[dict[str, Any]]] = {}
    for round_ in range(6):
        key = {"PK": f"CART#{round_}", "SK": "PRODUCT#p"}
        write.add_child(key, {"quantity": 2})
        if round_ == 2:
            rogue_add(stamped, {"PK": "PRODUCT#p", "SK": "TOTAL"}, "total", -5)
        drain(stamped, batch_size)
        write.change_amount(key, 4)  # in flight while the looks run
        total += 4
        stamped.lag.hidden = [{"PK": f"CART#{n}", "SK": "PRODUCT#p"} for n in range(round_ + 1)]
        if alerts := look(stamped):
            alerted[round_] = alerts
    assert list(alerted) in ([3], [4]), alerted
    (alert,) = next(iter(alerted.values()))
    assert (alert["kind"], alert["repair"]["status"]) == ("drift", "applied")
    assert Decimal(str(alert["actual"])) - Decimal(str(alert["stored"])) == 5
    assert settle(stamped, batch_size) == []
    assert stamped.stack.item("PRODUCT#p", "TOTAL")["total"] == total


def test_a_change_whose_child_the_window_has_not_seen_is_waited_for_not_judged(
    stamped: Followers,
) -> None:
    """Split shards: the parent's records of two follows are delivered, the first edge's
    record is held back (its shard lags), and the index shows neither edge. Only the newest
    stamp's child is read from the table: judged now, the count would miss the first edge
    and a repair would set it short. The look waits for the window to see it."""
    stamped.profile("ann")
    write = writer(stamped)
    follow(write, "dan", "ann")
    assert settle(stamped, 1) == []
    follow(write, "eve", "ann")
    follow(write, "fay", "ann")
    stamped.lag.hidden = [edge_key(u, "ann") for u in ("eve", "fay")]
    held = deliver_all_but(stamped, "USER#eve")
    for _ in range(3):
        assert look(stamped) == []
    assert stamped.stack.audit.log.repairs() == []
    stamped.stack.deliver(held)
    assert settle(stamped, 1) == []
    assert stamped.count("ann") == 3
    assert stamped.stack.audit.log.repairs() == []


# Found by review: sequences in which a stamped look once judged a parent wrongly.


def test_two_removals_of_unstamped_children_leave_stamps_no_outsiders_change_can_pass_for(
    stamped: Followers,
) -> None:
    """Edges no writer stamped, removed by the stamped writers: each removal leaves "?" and
    a fresh token, never the same stamp twice. An outsider's transaction in flight at the
    look (its edge in neither the window nor the index) is then never counted as stamped."""
    stamped.profile("ann")
    stamped.follow("o1", "ann")  # an outsider's (or a pre-stamp) writer
    stamped.follow("o2", "ann")
    assert settle(stamped, 1) == []
    write = writer(stamped)
    assert write.remove_child(edge_key("o1", "ann")).outcome == "removed"
    assert settle(stamped, 1) == []
    assert write.remove_child(edge_key("o2", "ann")).outcome == "removed"
    ann = stamped.stack.item("USER#ann", "PROFILE")
    marks = [ann["tallyStamp0"], ann["tallyStamp1"]]
    assert all(m.startswith("?") for m in marks) and marks[0] != marks[1]
    drain(stamped, 1)
    stamped.follow("o3", "ann")  # an outsider's transaction, in flight at the look
    stamped.lag.hidden = [edge_key("o3", "ann")]
    assert look(stamped) == []
    assert stamped.stack.audit.log.repairs() == []
    assert settle(stamped, 1) == []
    assert stamped.count("ann") == 1 and stamped.stack.audit.log.repairs() == []


def test_an_outsiders_edge_then_its_count_without_a_revision_is_not_judged_at_once(
    stamped: Followers,
) -> None:
    """A non-transactional outsider puts an edge, then adds 1 to the counter without the
    revision: the counter moved behind the writers' backs since the reference (the
    writers' total did not), so the look waits, and the edge is in the window by then."""
    stamped.profile("ann")
    write = writer(stamped)
    follow(write, "dan", "ann")
    drain(stamped, 1)
    stamped.stack.put(stamped.edge("fay", "ann"))
    rogue_add(stamped, {"PK": "USER#ann", "SK": "PROFILE"}, "followerCount", 1)
    stamped.lag.hidden = [edge_key("fay", "ann")]
    assert look(stamped) == []
    assert settle(stamped, 1) == []
    assert stamped.count("ann") == 2 and stamped.stack.audit.log.repairs() == []


def test_a_refollow_in_a_later_batch_does_not_keep_a_resting_parent_from_being_judged(
    stamped: Followers,
) -> None:
    """Follow, unfollow, follow again, each in its own batch: the edge's note holds only the
    last record's tokens, while the parent still holds the earlier ones. A later change of
    the same child in the window tells that the earlier ones passed: a rogue +3 on the
    resting parent is alerted as on any other."""
    stamped.profile("ann")
    write = writer(stamped)
    follow(write, "dan", "ann")
    drain(stamped, 100)
    follow(write, "eve", "ann")
    drain(stamped, 100)
    assert write.remove_child(edge_key("eve", "ann")).outcome == "removed"
    drain(stamped, 100)
    follow(write, "eve", "ann")
    assert settle(stamped, 100) == []
    rogue_add(stamped, {"PK": "USER#ann", "SK": "PROFILE"}, "followerCount", 3)
    alerts: list[dict[str, Any]] = []
    for _ in range(3):
        drain(stamped, 100)
        alerts += look(stamped)
    assert kinds(alerts) == [("drift", "USER#ann", "applied")]
    assert stamped.count("ann") == 2


def test_a_writers_join_pushed_out_of_the_stamps_is_not_judged_short_on_one_look(
    stamped: Followers,
) -> None:
    """The writers' own follow (eve), its edge's record on a shard that lags more than a
    grace and not in the index yet; eight follows after it (stamp_depth = 8) push its stamp
    out. A look finds the counter one above what it can count: it looks again before any
    repair, and by then the shard delivered the edge."""
    stamped.profile("ann")
    assert settle(stamped, 1) == []
    write = writer(stamped)
    follow(write, "eve", "ann")
    for n in range(8):
        follow(write, f"u{n}", "ann")
    stamped.lag.hidden = [edge_key("eve", "ann")]
    held = deliver_all_but(stamped, "USER#eve")
    assert look(stamped) == []
    assert stamped.stack.audit.log.repairs() == []
    stamped.stack.deliver(held)
    assert settle(stamped, 1) == []
    assert stamped.count("ann") == 9 and stamped.stack.audit.log.repairs() == []


def test_a_rogue_delete_that_balances_a_stamped_unfollows_count_is_found(
    stamped: Followers,
) -> None:
    """A stamped writer's unfollow, its edge's record in one batch and its count's in the
    next beside a rogue delete of another edge (-1 and -1: balanced), the index still
    showing the deleted edge. The edge's record attests itself (no look); the balanced batch
    must not prove itself: its rogue delete is looked at."""
    write = writer(stamped)
    stamped.profile("ann")
    for follower in ("dan", "eve"):
        follow(write, follower, "ann")
    settle(stamped, 100)
    assert write.remove_child(edge_key("dan", "ann")).outcome == "removed"
    stale = stamped.stack.item("USER#eve", "FOLLOWS#ann")
    assert stale is not None
    stamped.stack.delete("USER#eve", "FOLLOWS#ann")
    stamped.lag.stale.append(stale)
    look_between_halves(stamped, "USER#dan", looks=0)  # the unfollow's edge attests itself
    alerts = settle(stamped, 100)
    assert kinds(alerts) == [("drift", "USER#ann", "applied")]
    assert stamped.count("ann") == 0


@BATCHES
def test_a_look_whose_parent_moves_during_its_reads_tries_again_at_once(
    stamped: Followers, batch_size: int
) -> None:
    """A writer's follow lands while the look queries the index: the parent moved during
    the look's reads. The look tries again at once from the parent it read after, and
    observes the fault there (the new change is the newest, its child read from the
    table): the second look a grace later confirms it, not a third."""
    write = ann_with_a_rogue_edge(stamped, batch_size)
    moves = ["gus"]

    def follow_during_the_query(**_: Any) -> None:
        if moves:
            follow(write, moves.pop(), "ann")

    client = runtime._clients()[0]
    client.meta.events.register("after-call.dynamodb.Query", follow_during_the_query)
    try:
        assert look(stamped) == []  # the fault observed, at the revision after the follow
    finally:
        client.meta.events.unregister("after-call.dynamodb.Query", follow_during_the_query)
    assert moves == []
    drain(stamped, batch_size)
    assert kinds(look(stamped)) == [("drift", "USER#ann", "applied")]
    assert stamped.count("ann") == 4
    assert settle(stamped, batch_size) == []
