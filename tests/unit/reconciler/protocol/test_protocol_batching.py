"""Item collections at once: which groups share an item collection (and so run in order,
in one worker)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.protocol.batching import item_collections


@dataclass(frozen=True)
class Group:
    parent_key: dict[str, str]


keys = st.tuples(st.sampled_from(["POST#a", "POST#b", "POST#c", "ORDER#1"]), st.text(max_size=3))


@settings(max_examples=1000, deadline=None)
@given(st.lists(keys, unique=True, max_size=30))
def test_every_group_lands_in_the_collection_of_its_partition_key_in_batch_order(
    parents: list[tuple[str, str]],
) -> None:
    groups = [Group({"PK": pk, "SK": sk}) for pk, sk in parents]
    collections = item_collections(groups, "PK")
    assert sorted(map(id, (g for c in collections for g in c))) == sorted(map(id, groups))
    for collection in collections:
        assert len({g.parent_key["PK"] for g in collection}) == 1
        positions = [groups.index(g) for g in collection]
        assert positions == sorted(positions)
    heads = [c[0].parent_key["PK"] for c in collections]
    assert len(heads) == len(set(heads))
    assert heads == list(dict.fromkeys(pk for pk, _ in parents))
