"""The replicator's links, without a database: what a link holds, and a delivery that cannot
reach its destination waiting again."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from tally.local.replication.clocks import KeyLocks, RegionClock
from tally.local.replication.replicator import Change, Lag, LinkQueue, Replicator
from tally.local.replication.wire import WireStamp, wire_key

US, EU = "us-east-1", "eu-west-1"
KEY = wire_key({"PK": {"S": "POST#1"}, "SK": {"S": "META"}})


def change(at: int, likes: int) -> Change:
    return Change("t", KEY, {"likes": {"N": str(likes)}}, WireStamp(at, US))


class Unreachable:
    def transact_write_items(self, **_: Any) -> None:
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")


def test_a_link_keeps_the_newest_change_of_an_item_in_the_place_of_the_first() -> None:
    link = LinkQueue(US, EU)
    link.hold(change(1, 1), due=5.0)
    link.hold(change(3, 3), due=9.0)
    link.hold(change(2, 2), due=1.0)  # older than what it holds: no effect
    assert link.pending[("t", KEY)] == (change(3, 3), 5.0)
    assert link.due(4.9) == [] and link.due(5.0) == [("t", KEY)]


def test_a_delivery_that_cannot_reach_its_destination_waits_on_the_link_again() -> None:
    clocks = {r: RegionClock(r) for r in (US, EU)}
    replicator = Replicator(
        {US: Unreachable(), EU: Unreachable()}, {}, clocks, KeyLocks(), Lag(0), now=lambda: 7.0
    )
    replicator.links[(US, EU)].hold(change(1, 1), due=0.0)
    with pytest.raises(EndpointConnectionError):
        replicator.deliver(US, EU, ("t", KEY))
    assert replicator.links[(US, EU)].pending == {}
    replicator.hold_again(US, EU, ("t", KEY))
    assert replicator.links[(US, EU)].pending == {("t", KEY): (change(1, 1), 7.0)}
    assert replicator.busy()
