"""The project's writers on an emulated Global Table leave the evidence a Region needs to read
the loss of its own writes from its own stream, and each loss is read by one Region only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tally.core.regions import CHILD_ID, is_regional
from tally.reconciler.protocol.regions import Loss, own_loss, still_lost
from tally.rules import DEFAULT_RULES_FILE, load_rules
from tally.writers import InvalidRequestError, SequenceAllocator, TallyWriter
from tests.harness.regions import AP, EU, US, GlobalTable, plain, regional_databases, wire
from tests.harness.seed_writers import take_issue

RULES = load_rules(DEFAULT_RULES_FILE)
PROJECT = {"PK": "PROJECT#1", "SK": "COUNTER#ISSUE"}
POST = {"PK": "POST#1", "SK": "META"}
LIKE = {"PK": "POST#1", "SK": "LIKE#USER#7"}


@pytest.fixture(scope="module")
def databases() -> Iterator[dict[str, str]]:
    with regional_databases() as endpoints:
        yield endpoints


def losses(table: GlobalTable) -> list[tuple[Loss, bool]]:
    """Every loss each Region reads from its own stream, and whether it stands against what
    the Region holds once settled."""
    found = []
    for region in table.regions:
        for record in table.records(region):
            images = record["dynamodb"]
            old = plain(images["OldImage"]) if "OldImage" in images else None
            new = plain(images["NewImage"]) if "NewImage" in images else None
            loss = own_loss(record["eventName"], plain(images["Keys"]), old, new, region)
            if loss is not None:
                found.append((loss, still_lost(loss, table.item(region, loss.key))))
    return found


def test_a_number_handed_out_in_two_regions_is_read_once_by_the_region_that_lost_it(
    databases: dict[str, str],
) -> None:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]})
    try:
        table.put(US, PROJECT)
        table.emulator.settle()
        got = {
            r: SequenceAllocator(table.clients[r], table.name, RULES, region=r).allocate(
                PROJECT, strategy="gapless", attributes={"title": f"filed in {r}"}
            )
            for r in (US, EU)
        }
        assert got[US].numbers == got[EU].numbers  # both Regions handed out the same number
        table.emulator.settle()
        [(loss, stands)] = losses(table)
        assert stands and loss.kind == "child_overwritten"
        assert (loss.region, loss.winner) == (US, EU)  # EU wrote later: US lost its issue
        assert loss.lost_child is not None and loss.lost_child["title"] == f"filed in {US}"
        member = table.item(EU, loss.key)
        assert member is not None and member["title"] == f"filed in {EU}"
    finally:
        table.close()


def test_seed_003_handing_a_number_out_again_in_its_own_region_is_read_there_as_a_loss(
    databases: dict[str, str],
) -> None:
    """Seed 003's allocator, adopted (stamps on its put, which stays unconditional): us hands
    out 1 and 2, eu then 1 (later); last writer wins keeps eu's counter (1) and eu's 1
    everywhere. us's next number is 2 again, and its put replaces us's own member 2: a number
    handed out twice, lost in us, with no other Region in it. us reads both of its losses,
    eu none."""
    table = GlobalTable.make({US: databases[US], EU: databases[EU]})
    try:
        table.put(US, {**PROJECT, "lastIssue": 0})
        table.emulator.settle()
        project = PROJECT["PK"]
        taken = [take_issue(table.clients[US], table.name, US, project) for _ in range(2)]
        assert take_issue(table.clients[EU], table.name, EU, project)[0] == taken[0][0]
        table.emulator.settle()
        counter = table.item(US, PROJECT)
        assert counter is not None and counter["lastIssue"] == 1  # eu's count won: it went back
        again, _ = take_issue(table.clients[US], table.name, US, project)
        assert again == taken[1][0]  # us handed out its number 2 a second time
        table.emulator.settle()
        found = sorted(
            (loss.region, loss.key["SK"], loss.winner, loss.child_id, stands)
            for loss, stands in losses(table)
            if loss.kind == "child_overwritten"
        )
        assert found == [
            (US, taken[0][0], EU, taken[0][1], True),  # lost to eu's 1
            (US, taken[1][0], US, taken[1][1], True),  # lost to us's own second 2
        ]
    finally:
        table.close()


def test_likes_made_in_two_regions_lose_one_child_and_one_increment_read_by_the_loser(
    databases: dict[str, str],
) -> None:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]})
    try:
        table.put(US, {**POST, "likeTally": 0})
        table.emulator.settle()
        for region in (US, EU):
            writer = TallyWriter(table.clients[region], table.name, RULES, region=region)
            assert writer.add_child(LIKE).outcome == "created"
        table.emulator.settle()
        found = sorted((loss.kind, loss.region, stands) for loss, stands in losses(table))
        assert found == [("child_overwritten", US, True), ("increments_lost", US, True)]
    finally:
        table.close()


def test_a_child_lost_for_a_while_then_back_is_no_loss_and_the_real_loser_reads_its_own(
    databases: dict[str, str],
) -> None:
    """us's like reaches ap; eu's like under the same key (later) replaces us's in us; ap
    then changes us's like (later still), which wins everywhere: eu lost, us did not."""
    table = GlobalTable.make(databases)
    try:
        table.put(US, {**POST, "likeTally": 0})
        table.emulator.settle()
        TallyWriter(table.clients[US], table.name, RULES, region=US).add_child(LIKE)
        assert table.deliver(US, AP, LIKE)
        TallyWriter(table.clients[EU], table.name, RULES, region=EU).add_child(LIKE)
        assert table.deliver(EU, US, LIKE)  # us's like replaced in us, for now
        table.clients[AP].update_item(  # a program of the team's, in ap
            TableName=table.name,
            Key=wire(LIKE),
            UpdateExpression="SET seen = :t",
            ExpressionAttributeValues={":t": {"BOOL": True}},
        )
        table.emulator.settle()
        like = table.item(US, LIKE)
        assert like is not None and like[CHILD_ID].startswith(f"{US}:") and like["seen"]
        children = [
            (loss.region, stands)
            for loss, stands in losses(table)
            if loss.kind == "child_overwritten"
        ]
        assert sorted(children) == [(EU, True), (US, False)]  # us's was back: it stands not
    finally:
        table.close()


def test_a_writer_without_a_region_writes_no_stamps(databases: dict[str, str]) -> None:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]})
    try:
        table.put(US, {**POST, "likeTally": 0})
        TallyWriter(table.clients[US], table.name, RULES).add_child(LIKE)
        like, post = table.item(US, LIKE), table.item(US, POST)
        assert like == LIKE and post is not None and post["likeTally"] == 1
        assert not [name for name in post if is_regional(name)]
    finally:
        table.close()


def test_a_writer_given_a_region_refuses_the_attributes_it_stamps(
    databases: dict[str, str],
) -> None:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]})
    try:
        table.put(US, {**POST, "likeTally": 0})
        writer = TallyWriter(table.clients[US], table.name, RULES, region=US)
        with pytest.raises(InvalidRequestError) as refused:
            writer.add_child(LIKE, {"tallyChildId": "eu-west-1:forged"})
        assert refused.value.field == ("attributes", "tallyChildId")
        numbers = SequenceAllocator(table.clients[US], table.name, RULES, region=US)
        with pytest.raises(InvalidRequestError):
            numbers.allocate(PROJECT, attributes={"tallyOrigin": "eu-west-1"})
        assert table.item(US, LIKE) is None
    finally:
        table.close()
