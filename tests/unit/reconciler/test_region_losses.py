"""A Region reads the loss of its own writes, and only its own, from its stream's records."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.regions import CHILD_ID, ORIGIN, writes
from tally.reconciler.protocol.regions import GlobalMode, own_loss, still_lost

US, EU, AP = "us-east-1", "eu-west-1", "ap-southeast-2"
KEY = {"PK": "PROJECT#1", "SK": "ISSUE#00008"}
POST = {"PK": "POST#1", "SK": "META"}


def child(region: str, made_in: str, title: str) -> dict[str, Any]:
    return {**KEY, "title": title, ORIGIN: region, CHILD_ID: f"{made_in}:{title}"}


def parent(origin: str, **ours: int) -> dict[str, Any]:
    counts: dict[str, Any] = {**POST, ORIGIN: origin, "likeTally": Decimal(sum(ours.values()))}
    for region, n in ours.items():
        region = region.replace("_", "-")
        counts[writes(region)] = Decimal(n)
    return counts


def test_a_child_of_ours_replaced_by_another_regions_is_a_loss_with_its_payload() -> None:
    loss = own_loss("MODIFY", KEY, child(US, US, "mine"), child(EU, EU, "theirs"), US)
    assert loss is not None and loss.kind == "child_overwritten"
    assert (loss.region, loss.winner, loss.child_id) == (US, EU, f"{US}:mine")
    assert loss.lost_child == {**KEY, "title": "mine"}  # no stamps in the payload


def test_the_same_record_read_in_another_region_is_not_its_loss() -> None:
    """A third Region sees us's child replaced by eu's too: us reports it, not ap."""
    assert own_loss("MODIFY", KEY, child(US, US, "a"), child(EU, EU, "b"), AP) is None
    assert own_loss("MODIFY", KEY, child(US, US, "a"), child(EU, EU, "b"), EU) is None


def test_our_own_later_child_over_our_child_is_a_number_handed_out_twice() -> None:
    """A put without a condition (seed 003's) after our counter went back: our child lost."""
    loss = own_loss("MODIFY", KEY, child(US, US, "a"), child(US, US, "b"), US)
    assert loss is not None and loss.kind == "child_overwritten"
    assert (loss.region, loss.winner, loss.child_id) == (US, US, f"{US}:a")
    # Read in another Region, the same replacement is not its loss.
    assert own_loss("MODIFY", KEY, child(US, US, "a"), child(US, US, "b"), EU) is None


def test_our_own_write_over_our_child_that_carries_no_id_is_no_loss() -> None:
    """An update by a put that does not stamp: nothing proves a second child."""
    unstamped = {**KEY, "title": "renamed", ORIGIN: US}
    assert own_loss("MODIFY", KEY, child(US, US, "a"), unstamped, US) is None
    assert own_loss("MODIFY", KEY, child(US, US, "a"), {**child(US, US, "a"), "t": 1}, US) is None


def test_another_region_changing_our_child_keeps_its_id_and_is_no_loss() -> None:
    changed = {**child(EU, US, "a"), "title": "renamed"}
    assert own_loss("MODIFY", KEY, child(US, US, "a"), changed, US) is None


@pytest.mark.parametrize("event", ["INSERT", "REMOVE"])
def test_an_insert_or_a_deletion_is_no_overwrite(event: str) -> None:
    old = child(US, US, "a") if event == "REMOVE" else None
    new = child(EU, EU, "b") if event == "INSERT" else None
    assert own_loss(event, KEY, old, new, US) is None


def test_a_parent_that_holds_fewer_of_our_writes_lost_them() -> None:
    loss = own_loss(
        "MODIFY",
        POST,
        parent(US, us_east_1=5, eu_west_1=2),
        parent(EU, us_east_1=3, eu_west_1=3),
        US,
    )
    assert loss is not None and loss.kind == "increments_lost"
    assert (loss.writes, loss.winner) == (2, EU)
    # eu's own count went up: no loss of eu's in us's stream, and eu reads none of us's.
    assert (
        own_loss(
            "MODIFY",
            POST,
            parent(US, us_east_1=5, eu_west_1=2),
            parent(EU, us_east_1=3, eu_west_1=3),
            EU,
        )
        is None
    )


def test_a_parent_written_before_the_writers_stamped_it_loses_nothing_it_cannot_show() -> None:
    assert (
        own_loss("MODIFY", POST, {**POST, "likeTally": Decimal(3)}, parent(EU, eu_west_1=1), US)
        is None
    )


def test_a_child_loss_stands_unless_the_child_is_back() -> None:
    loss = own_loss("MODIFY", KEY, child(US, US, "a"), child(EU, EU, "b"), US)
    assert loss is not None
    assert still_lost(loss, child(EU, EU, "b"))
    assert still_lost(loss, None)
    assert not still_lost(loss, {**child(AP, US, "a"), "title": "renamed in ap"})


regions = st.sampled_from([US, EU, AP])


@given(
    reader=regions, old_origin=regions, new_origin=regions, made_in=regions, same_id=st.booleans()
)
def test_a_region_only_ever_reports_a_child_it_made(
    reader: str, old_origin: str, new_origin: str, made_in: str, same_id: bool
) -> None:
    old = child(old_origin, made_in, "a")
    new = child(new_origin, made_in if same_id else new_origin, "a" if same_id else "b")
    loss = own_loss("MODIFY", KEY, old, new, reader)
    if loss is not None:
        assert loss.region == reader == made_in
        assert not same_id
    else:  # each child of ours replaced by another child is read, whoever replaced it
        assert reader != made_in or same_id


def test_one_region_is_home_to_every_parent() -> None:
    assert GlobalMode(US, (US, EU), US, 60).at_home
    assert not GlobalMode(EU, (US, EU), US, 60).at_home
    with pytest.raises(ValueError, match="must be of"):
        GlobalMode(EU, (US, EU), AP, 60)


def test_on_a_global_table_counts_are_judged_settled_and_sequences_never_repaired() -> None:
    from tally.reconciler.protocol.regions import settled_rules
    from tally.rules import DEFAULT_RULES_FILE, SequenceRule, TallyRule, load_rules

    rules = load_rules(DEFAULT_RULES_FILE)
    settled = settled_rules(rules, 45)
    assert [r.name for r in settled] == [r.name for r in rules]
    for before, after in zip(rules, settled, strict=True):
        if isinstance(after, SequenceRule):
            assert isinstance(before, SequenceRule)
            assert after.grace_seconds == max(before.grace_seconds, 45)
            assert after.repair == "alert"  # a void or a raised counter races members
        else:
            assert isinstance(after, TallyRule) and isinstance(before, TallyRule)
            assert after.on_ttl_expiry == "alert"  # a TTL decrement is a write too
            stamped = after.through is not None and after.through.stamp is not None
            if stamped:
                assert after.repair == "alert"
            else:
                assert after.lag_seconds == (before.lag_seconds or 45)
                assert after.repair == before.repair  # an auto rule: repaired when settled
    assert any(r.repair == "auto" and isinstance(r, TallyRule) for r in settled)
