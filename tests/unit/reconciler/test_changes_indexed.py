"""Stream records of children found through an index, folded into their parents' groups.

An edge names its followee in its index key, old image and new image alike: each parent's
group gets what the images naming it say, so a moved edge is -1 on one and +1 on the other,
whatever batches the records fall into.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.protocol.window import latest
from tally.reconciler.stream.grouping import group_records
from tally.rules import load_rules
from tests.utils import stream_record

RULES = load_rules(Path(__file__).parents[2] / "integration" / "index_rules.toml")
USERS = ["ann", "bob", "cy"]
STATUSES = ["FOLLOWING#", "BLOCKED#", None]  # None: no index key (sparse)


def edge(followee: str, status: str | None) -> dict[str, Any]:
    if status is None:
        return {"note": "no index key"}
    return {"GSI1PK": f"USER#{followee}", "GSI1SK": f"{status}x"}


def record(follower: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> Any:
    keys = {"PK": f"USER#{follower}", "SK": "FOLLOWS#1"}
    event = "INSERT" if old is None else "REMOVE" if new is None else "MODIFY"
    return stream_record(event, keys, new, old)


def counted(image: dict[str, Any] | None) -> str | None:
    if image is None or not image.get("GSI1SK", "").startswith("FOLLOWING#"):
        return None
    return str(image["GSI1PK"])


def deltas(records: list[Any]) -> Counter[str]:
    out: Counter[str] = Counter()
    for group in group_records(records, RULES).groups.values():
        if group.child_delta:
            out[group.parent_key["PK"]] += int(group.child_delta)
    return out


def test_a_moved_edge_is_minus_one_on_its_old_followee_and_plus_one_on_its_new() -> None:
    moved = record("dan", edge("ann", "FOLLOWING#"), edge("bob", "FOLLOWING#"))
    batch = group_records([moved], RULES)
    assert {g.parent_key["PK"]: g.child_delta for g in batch.groups.values()} == {
        "USER#ann": Decimal(-1),
        "USER#bob": Decimal(1),
    }
    assert not any(g.balanced for g in batch.groups.values())


def test_an_edge_that_leaves_the_counted_status_is_minus_one() -> None:
    blocked = record("dan", edge("ann", "FOLLOWING#"), edge("ann", "BLOCKED#"))
    (group,) = group_records([blocked], RULES).groups.values()
    assert (group.parent_key["PK"], group.child_delta) == ("USER#ann", Decimal(-1))


def test_an_edge_with_no_counted_index_key_before_or_after_is_skipped() -> None:
    batch = group_records([record("dan", edge("ann", None), edge("ann", "BLOCKED#"))], RULES)
    assert (batch.groups, batch.skipped, batch.malformed) == ({}, 1, [])


def test_an_index_key_no_writer_can_store_is_logged_and_blocks_nothing() -> None:
    bad = record("dan", None, {"GSI1PK": {"M": {}}, "GSI1SK": "FOLLOWING#x"})
    bad["dynamodb"]["NewImage"]["GSI1PK"] = {"Q": "?"}  # no DynamoDB type
    batch = group_records([bad, record("eve", None, edge("ann", "FOLLOWING#"))], RULES)
    assert len(batch.malformed) == 1
    assert [g.parent_key["PK"] for g in batch.groups.values()] == ["USER#ann"]


images = st.tuples(st.sampled_from(USERS), st.sampled_from(STATUSES)).map(lambda t: edge(*t))
histories = st.lists(
    st.tuples(st.sampled_from(["dan", "eve"]), st.one_of(st.none(), images)),
    max_size=12,
)


@settings(max_examples=1000)
@given(history=histories, cuts=st.lists(st.integers(0, 12), max_size=4))
def test_under_any_batching_each_followee_gets_exactly_its_change_in_counted_edges(
    history: list[tuple[str, dict[str, Any] | None]], cuts: list[int]
) -> None:
    """Whatever each write did (follow, unfollow, move, status change, sparse), and wherever
    batches end, the child deltas a followee's groups add up to are its change in edges."""
    stored: dict[str, dict[str, Any] | None] = {"dan": None, "eve": None}
    records, truth = [], Counter[str]()
    for follower, image in history:
        before = stored[follower]
        if before is None and image is None:
            continue
        records.append(record(follower, before, image))
        for side, sign in ((before, -1), (image, 1)):
            if (parent := counted(side)) is not None:
                truth[parent] += sign
        stored[follower] = image
    bounds = sorted({0, len(records), *(c for c in cuts if c <= len(records))})
    folded: Counter[str] = Counter()
    for start, end in pairwise(bounds):
        folded.update(deltas(records[start:end]))
    assert +folded == +truth and -folded == -truth


@settings(max_examples=1000)
@given(history=histories, cuts=st.lists(st.integers(0, 12), max_size=4))
def test_every_change_of_a_followees_count_notes_its_edge_in_the_group_whatever_the_batching(
    history: list[tuple[str, dict[str, Any] | None]], cuts: list[int]
) -> None:
    """A look counts a noted child from the table, so a child the index does not show yet
    cannot hide: every record that changed an edge's count under a followee notes that edge
    in the followee's group of its batch, and no record that left the count alone does."""
    stored: dict[str, dict[str, Any] | None] = {"dan": None, "eve": None}
    records: list[Any] = []
    written: list[dict[str, Any] | None] = []  # per record: the edge it left
    changed: list[set[tuple[str, str]]] = []  # per record: (followee, follower) it moved
    for follower, image in history:
        before = stored[follower]
        if before is None and image is None:
            continue
        records.append(record(follower, before, image))
        written.append(image)
        parents = {counted(before), counted(image)} - {None}
        moved = counted(before) != counted(image)
        changed.append({(str(p), follower) for p in parents} if moved else set())
        stored[follower] = image
    bounds = sorted({0, len(records), *(c for c in cuts if c <= len(records))})
    for start, end in pairwise(bounds):
        expected = set().union(*changed[start:end]) if end > start else set()
        groups = group_records(records[start:end], RULES).groups.values()
        noted = {
            (group.parent_key["PK"], note.key["PK"].removeprefix("USER#"))
            for group in groups
            for note in group.indexed_children
        }
        assert noted == expected
        # An edge's latest note in a group says whether its last change there left it
        # counted under that parent.
        for group in groups:
            parent = group.parent_key["PK"]
            for note in latest(group.indexed_children).values():
                follower = note.key["PK"].removeprefix("USER#")
                last = max(i for i in range(start, end) if (parent, follower) in changed[i])
                assert note.counted == (counted(written[last]) == parent)
