"""Changes that attest themselves: a stamped writer's own change, told from its record.

A parent record whose counter moved with the writers' total, its revision by one and its
stamps one place down under a new one, and a child record whose stamp the parent holds as
the newest of that child's (read consistently), were one of the writers' transactions: no
look is scheduled for them, on one shard or split. Every change an outsider makes, however
like a writer's it looks (a token kept, copied, or brought back with an old item), is looked
at, alerted and repaired as before. Records are delivered one a batch, in stream order or
with each item's records held back behind the others' (split shards: a transaction's edge
and counter then arrive apart, either first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tally.core.stamps import key_mark
from tally.writers import TallyWriter
from tests.integration.conftest import Stack
from tests.integration.test_index_children import GRACE, Followers, index_stack, kinds
from tests.integration.test_stamped_parents import RULES, edge_key, follow, writer
from tests.utils import serialize

ORDERS = pytest.mark.parametrize("order", ["stream", "parents-first", "children-first"])


@pytest.fixture
def stamped(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Followers]:
    yield from index_stack(stack, monkeypatch, RULES)


def deliver(followers: Followers, order: str) -> None:
    """Every record waiting, one a batch: in stream order, or profiles' (children's) first."""
    records = followers.stack.records()
    if order != "stream":
        first = "PROFILE" if order == "parents-first" else "FOLLOWS#"
        records.sort(key=lambda r: not r["dynamodb"]["Keys"]["SK"]["S"].startswith(first))
    for record in records:
        followers.stack.deliver([record])


def settle(followers: Followers) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = []
    for _ in range(12):
        deliver(followers, "stream")
        followers.clock.advance(GRACE + 1)
        followers.stack.run_rechecks()
        alerts += followers.stack.alerts()
        if not followers.stack.pending_rechecks() and not followers.stack.records():
            return alerts
    raise AssertionError("the rechecks never went quiet")


def truth(followers: Followers, user: str) -> int:
    """The edges that follow ``user``, counted in the table itself."""
    items = followers.stack.dynamodb.scan(TableName=followers.stack.table)["Items"]
    return sum(
        1
        for item in items
        if item.get("GSI1PK", {}).get("S") == f"USER#{user}"
        and item.get("GSI1SK", {}).get("S", "").startswith("FOLLOWING#")
    )


@ORDERS
def test_the_writers_own_follows_unfollows_moves_and_blocks_schedule_no_look(
    stamped: Followers, order: str
) -> None:
    for user in ("ann", "bob"):
        stamped.profile(user)
    assert settle(stamped) == []  # an outsider's puts: looked at
    write = writer(stamped)
    steps: list[Callable[[], Any]] = [
        lambda: follow(write, "dan", "ann"),
        lambda: follow(write, "eve", "ann"),
        lambda: follow(write, "fay", "ann"),
        lambda: write.remove_child(edge_key("dan", "ann")),
        lambda: write.move_child(edge_key("eve", "ann"), {"GSI1PK": "USER#bob"}),
        lambda: write.move_child(edge_key("fay", "ann"), {"GSI1SK": "BLOCKED#2026-11-28"}),
        lambda: write.move_child(edge_key("fay", "ann"), {"GSI1SK": "FOLLOWING#2026-11-28"}),
        lambda: write.move_child(edge_key("eve", "ann"), {"GSI1PK": "USER#ann"}),
    ]
    for step in steps:
        step()
        deliver(stamped, order)
        assert stamped.stack.pending_rechecks() == 0  # each attested itself
    assert stamped.stack.alerts() == []
    assert (stamped.count("ann"), stamped.count("bob")) == (2, 0) == (truth(stamped, "ann"), 0)


def test_a_batch_that_holds_an_outsiders_change_beside_the_writers_is_looked_at(
    stamped: Followers,
) -> None:
    stamped.profile("ann")
    assert settle(stamped) == []
    write = writer(stamped)
    follow(write, "dan", "ann")
    stamped.stack.put(stamped.edge("eve", "ann"))  # no count for it
    while stamped.stack.pump():  # one batch: both edges and the profile
        pass
    assert stamped.stack.pending_rechecks() == 1
    assert kinds(settle(stamped)) == [("drift", "USER#ann", "applied")]
    assert stamped.count("ann") == 2 == truth(stamped, "ann")


def item(followers: Followers, follower: str, followee: str) -> dict[str, Any]:
    found = followers.stack.item(f"USER#{follower}", f"FOLLOWS#{followee}")
    assert found is not None
    return found


def put(followers: Followers, value: dict[str, Any]) -> None:
    followers.stack.dynamodb.put_item(TableName=followers.stack.table, Item=serialize(value))


def outsider_deletes(followers: Followers, write: TallyWriter) -> None:
    key = serialize(edge_key("dan", "ann"))
    followers.stack.dynamodb.delete_item(TableName=followers.stack.table, Key=key)


def outsider_moves_keeping_the_token(followers: Followers, write: TallyWriter) -> None:
    put(followers, {**item(followers, "dan", "ann"), "GSI1PK": "USER#bob"})


def outsider_blocks_keeping_the_token(followers: Followers, write: TallyWriter) -> None:
    put(followers, {**item(followers, "dan", "ann"), "GSI1SK": "BLOCKED#2026-11-28"})


def outsider_restores_an_unfollowed_edge(followers: Followers, write: TallyWriter) -> None:
    before = item(followers, "dan", "ann")
    write.remove_child(edge_key("dan", "ann"))
    put(followers, before)  # its token and all, as it stood


def outsider_writes_back_a_moved_edge(followers: Followers, write: TallyWriter) -> None:
    before = item(followers, "dan", "ann")
    write.move_child(edge_key("dan", "ann"), {"GSI1PK": "USER#bob"})
    put(followers, before)  # a stale copy over the writer's newer one


def outsider_writes_back_an_edge_removed_after_a_change(
    followers: Followers, write: TallyWriter
) -> None:
    before = item(followers, "dan", "ann")
    write.move_child(edge_key("dan", "ann"), {"GSI1SK": "FOLLOWING#2026-11-29"})
    write.remove_child(edge_key("dan", "ann"))
    put(followers, before)  # a token the parent holds, but not as the child's newest


def outsider_copies_an_edge_to_another_key(followers: Followers, write: TallyWriter) -> None:
    copy = {**item(followers, "dan", "ann"), "PK": "USER#zed"}
    put(followers, copy)  # the token names dan's key: no writer made it for zed's


def outsider_writes_back_the_profile(followers: Followers, write: TallyWriter) -> None:
    before = followers.stack.item("USER#ann", "PROFILE")
    assert before is not None
    follow(write, "gus", "ann")
    put(followers, before)  # counter, total, revision and stamps as they were


def outsider_stamps_an_edge_of_its_own(followers: Followers, write: TallyWriter) -> None:
    """An edge put with a token like a writer's, for its own key, that no parent holds."""
    made = item(followers, "dan", "ann")["tallyStamp"]
    token = f"{made[:11]}{key_mark(edge_key('zed', 'ann'))}{'0' * 7}"
    put(followers, {**followers.edge("zed", "ann"), "tallyStamp": token})


OUTSIDERS = [
    outsider_deletes,
    outsider_moves_keeping_the_token,
    outsider_blocks_keeping_the_token,
    outsider_restores_an_unfollowed_edge,
    outsider_writes_back_a_moved_edge,
    outsider_writes_back_an_edge_removed_after_a_change,
    outsider_copies_an_edge_to_another_key,
    outsider_writes_back_the_profile,
    outsider_stamps_an_edge_of_its_own,
]


@pytest.mark.parametrize("outsider", OUTSIDERS, ids=[f.__name__[9:] for f in OUTSIDERS])
@pytest.mark.parametrize("order", ["stream", "children-first"])
def test_an_outsiders_change_that_looks_like_a_writers_is_looked_at_and_repaired(
    stamped: Followers, outsider: Callable[[Followers, TallyWriter], None], order: str
) -> None:
    for user in ("ann", "bob"):
        stamped.profile(user)
    write = writer(stamped)
    follow(write, "dan", "ann")
    follow(write, "eve", "ann")
    assert settle(stamped) == []
    outsider(stamped, write)
    deliver(stamped, order)
    assert stamped.stack.pending_rechecks() >= 1  # not attested
    alerts = settle(stamped)
    assert alerts and {a["kind"] for a in alerts} == {"drift"}
    assert {a["repair"]["status"] for a in alerts} == {"applied"}
    for user in ("ann", "bob"):
        assert (stamped.count(user) or 0) == truth(stamped, user)
    assert settle(stamped) == []
