"""The multi-Region emulator's replication decisions, one test per behaviour Global Tables
(MREC) show (docs/global-tables.md says which AWS documents and which are inferred), and a
property over any interleaving: once every link has delivered everything, every Region holds
the same items, each the version with the latest hidden timestamp."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.local.replication.versions import (
    Replication,
    ReplicationError,
    Stamp,
    key_of,
)

US, EU, AP = "us-east-1", "eu-west-1", "ap-southeast-2"
POST = {"PK": "POST#1", "SK": "META"}
LIKE = {"PK": "POST#1", "SK": "LIKE#7"}


def post(likes: int) -> dict[str, Any]:
    return {**POST, "likeTally": likes}


def test_a_write_applies_in_its_own_region_at_once_and_elsewhere_only_when_delivered() -> None:
    regions = Replication([US, EU])
    regions.write(US, POST, post(1), at=10)
    assert regions.replicas[US].items() == {key_of(POST): post(1)}
    assert regions.replicas[EU].items() == {}
    [delivery] = regions.settle()
    assert delivery.applied and regions.replicas[EU].items() == {key_of(POST): post(1)}


def test_two_regions_adding_one_to_a_counter_at_once_keep_one_increment() -> None:
    """Both read 5 and write 6 in their own Region: last writer wins, one +1 is lost."""
    regions = Replication([US, EU])
    regions.write(US, POST, post(6), at=100)
    regions.write(EU, POST, post(6), at=101)
    outcomes = {(d.source, d.applied) for d in regions.settle()}
    assert outcomes == {(US, False), (EU, True)}  # US's version lost in EU, EU's won in US
    for replica in regions.replicas.values():
        assert replica.versions[key_of(POST)].stamp == Stamp(101, EU)
        assert replica.items()[key_of(POST)]["likeTally"] == 6


def test_a_losing_version_changes_nothing_where_it_lands() -> None:
    regions = Replication([US, EU])
    regions.write(US, POST, post(1), at=100)
    regions.write(EU, POST, post(2), at=200)
    before = dict(regions.replicas[EU].versions)
    lost = regions.deliver(US, EU, key_of(POST))
    assert not lost.applied and regions.replicas[EU].versions == before


def test_a_later_write_wins_however_late_its_delivery() -> None:
    regions = Replication([US, EU])
    regions.write(EU, POST, post(2), at=200)
    regions.write(US, POST, post(1), at=100)  # written second, but earlier on the clock
    regions.settle()
    assert {r.items()[key_of(POST)]["likeTally"] for r in regions.replicas.values()} == {2}


def test_a_tie_on_the_clock_is_broken_by_the_region_name() -> None:
    regions = Replication([US, EU])
    regions.write(US, POST, post(1), at=100)
    regions.write(EU, POST, post(2), at=100)
    regions.settle()
    winner = max(Stamp(100, US), Stamp(100, EU)).region
    assert {r.versions[key_of(POST)].stamp.region for r in regions.replicas.values()} == {winner}


def test_a_transactions_items_replicate_one_by_one() -> None:
    """Atomic where it ran; elsewhere the child may arrive before its counter."""
    regions = Replication([US, EU])
    regions.transact(US, [(LIKE, LIKE), (POST, post(1))], at=10)
    regions.deliver(US, EU, key_of(LIKE))
    assert set(regions.replicas[EU].items()) == {key_of(LIKE)}
    regions.deliver(US, EU, key_of(POST))
    assert regions.replicas[EU].items() == regions.replicas[US].items()


def test_changes_to_one_item_in_a_short_time_replicate_as_one() -> None:
    regions = Replication([US, EU])
    for likes in (1, 2, 3):
        regions.write(US, POST, post(likes), at=likes)
    [merged] = regions.settle()
    assert merged.version.item == post(3)


def test_order_is_kept_per_item_only() -> None:
    regions = Replication([US, EU])
    regions.write(US, POST, post(1), at=1)
    regions.write(US, LIKE, LIKE, at=2)
    regions.deliver(US, EU, key_of(LIKE))  # the later item first
    assert set(regions.replicas[EU].items()) == {key_of(LIKE)}


def test_deletes_replicate_under_last_writer_wins_and_keep_their_stamp() -> None:
    regions = Replication([US, EU])
    regions.write(US, LIKE, LIKE, at=1)
    regions.settle()
    regions.write(EU, LIKE, None, at=5)  # deleted in EU
    regions.write(US, LIKE, {**LIKE, "at": "old"}, at=3)  # an older put from US, sent later
    regions.settle()
    for replica in regions.replicas.values():
        assert replica.items() == {}
        assert replica.versions[key_of(LIKE)].deleted  # the tombstone keeps the older put out
    regions.write(US, LIKE, {**LIKE, "at": "new"}, at=9)  # a newer put brings it back
    regions.settle()
    back = {key_of(LIKE): {**LIKE, "at": "new"}}
    assert all(r.items() == back for r in regions.replicas.values())


def test_a_newer_local_write_suppresses_an_older_one_still_on_its_way() -> None:
    regions = Replication([US, EU])
    regions.write(US, POST, post(1), at=1)  # pending US -> EU
    regions.write(EU, POST, post(7), at=2)
    assert not regions.deliver(US, EU, key_of(POST)).applied
    assert regions.replicas[EU].items()[key_of(POST)] == post(7)


def test_an_offline_region_holds_its_writes_and_replays_them_when_back() -> None:
    regions = Replication([US, EU])
    regions.take_offline(EU)
    regions.write(EU, POST, post(5), at=10)  # EU's own clients still write there
    regions.write(US, POST, post(3), at=20)
    assert regions.deliverable() == []
    with pytest.raises(ReplicationError, match="offline"):
        regions.deliver(US, EU, key_of(POST))
    regions.bring_back(EU)
    regions.settle()
    assert {r.items()[key_of(POST)]["likeTally"] for r in regions.replicas.values()} == {3}


def test_a_region_whose_clock_runs_ahead_wins_over_later_writes() -> None:
    regions = Replication([US, EU], skew={EU: 1_000_000})  # EU's clock a second ahead
    regions.write(EU, POST, post(1), at=100)
    regions.write(US, POST, post(2), at=500_000)  # half a second later, truly
    regions.settle()
    assert {r.items()[key_of(POST)]["likeTally"] for r in regions.replicas.values()} == {1}


def test_a_write_over_a_version_from_a_clock_running_ahead_is_stamped_after_it() -> None:
    """Else the writing Region keeps its own version while the others keep the one it
    replaced, for ever (found by the property below)."""
    regions = Replication([US, EU], skew={US: 2})
    regions.write(US, POST, post(1), at=0)  # stamped 2 by US's clock
    regions.settle()
    mine = regions.write(EU, POST, post(2), at=1)  # EU's clock says 1
    assert mine.stamp > Stamp(2, US)
    regions.settle()
    assert {r.items()[key_of(POST)]["likeTally"] for r in regions.replicas.values()} == {2}


def test_three_regions_each_send_their_own_writes_to_both_others() -> None:
    regions = Replication([US, EU, AP])
    regions.write(AP, POST, post(1), at=1)
    assert sorted((s, d) for s, d, _ in regions.deliverable()) == [(AP, EU), (AP, US)]
    regions.settle()
    assert all(r.items() == {key_of(POST): post(1)} for r in regions.replicas.values())


@pytest.mark.parametrize(
    ("regions", "said"),
    [([US], "two or more distinct"), ([US, US], "two or more distinct")],
)
def test_a_replication_needs_two_distinct_regions(regions: list[str], said: str) -> None:
    with pytest.raises(ReplicationError, match=said):
        Replication(regions)


def test_an_unknown_region_is_named() -> None:
    with pytest.raises(ReplicationError, match="no Region 'mars-1'"):
        Replication([US, EU]).write("mars-1", POST, post(1), at=1)


# --- any interleaving ------------------------------------------------------------------

REGIONS = [US, EU, AP]
KEYS = [{"PK": "POST#1", "SK": "META"}, {"PK": "POST#1", "SK": "LIKE#1"}, {"PK": "P#2", "SK": "M"}]
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            st.sampled_from(REGIONS),
            st.lists(st.tuples(st.integers(0, 2), st.none() | st.integers(0, 9)), min_size=1),
        ),
        st.tuples(st.just("deliver"), st.integers(0, 1000), st.none()),
        st.tuples(st.just("offline"), st.sampled_from(REGIONS), st.none()),
        st.tuples(st.just("online"), st.sampled_from(REGIONS), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps, st.dictionaries(st.sampled_from(REGIONS), st.integers(-5, 5)), st.randoms())
def test_once_every_link_delivered_everything_every_region_holds_the_latest_versions(
    plan: list[tuple[str, Any, Any]], skew: dict[str, int], chance: Any
) -> None:
    regions = Replication(REGIONS, skew)
    latest: dict[Any, Stamp] = {}
    for clock, (step, what, writes) in enumerate(plan):
        if step == "write":
            chosen = {n: value for n, value in writes}  # one write per item per transaction
            versions = regions.transact(
                what,
                [(KEYS[n], None if v is None else {**KEYS[n], "v": v}) for n, v in chosen.items()],
                at=clock,
            )
            for version in versions:
                latest[version.key] = max(latest.get(version.key, version.stamp), version.stamp)
        elif step == "deliver" and (deliverable := regions.deliverable()):
            regions.deliver(*deliverable[what % len(deliverable)])
        elif step == "offline":
            regions.take_offline(what)
        elif step == "online":
            regions.bring_back(what)
    for region in REGIONS:
        regions.bring_back(region)
    while deliverable := regions.deliverable():
        regions.deliver(*chance.choice(deliverable))
    held = [replica.versions for replica in regions.replicas.values()]
    assert all(versions == held[0] for versions in held)
    assert {key: version.stamp for key, version in held[0].items()} == latest
