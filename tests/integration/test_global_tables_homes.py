"""Prevention on a Global Table: a parent or sequence counter that names its home Region
(``tallyHome``) is changed by the writers of that Region only. A writer elsewhere is refused
before anything is written, so two Regions never race its increments or its numbers, and the
caller learns where to send the write (docs/global-tables.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tally.core.regions import CHILD_ID
from tally.rules import DEFAULT_RULES_FILE, load_rules
from tally.writers import ParentHomedElsewhereError, SequenceAllocator, TallyWriter
from tests.harness.regions import EU, US, GlobalTable, regional_databases

RULES = load_rules(DEFAULT_RULES_FILE)
POST = {"PK": "POST#1", "SK": "META"}
PROJECT = {"PK": "PROJECT#1", "SK": "COUNTER#ISSUE"}


@pytest.fixture(scope="module")
def databases() -> Iterator[dict[str, str]]:
    with regional_databases() as endpoints:
        yield endpoints


@pytest.fixture
def two(databases: dict[str, str]) -> Iterator[GlobalTable]:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]})
    yield table
    table.close()


def test_a_like_on_a_post_homed_elsewhere_is_refused_and_writes_nothing(two: GlobalTable) -> None:
    two.put(US, {**POST, "likeTally": 0, "tallyHome": US})
    two.emulator.settle()
    away = TallyWriter(two.clients[EU], two.name, RULES, region=EU)
    with pytest.raises(ParentHomedElsewhereError) as refused:
        away.add_child({**POST, "SK": "LIKE#USER#1"})
    assert (refused.value.home, refused.value.region, refused.value.key) == (US, EU, POST)
    assert "write it there" in str(refused.value)
    assert two.item(EU, {**POST, "SK": "LIKE#USER#1"}) is None  # the child's put rolled back
    home = TallyWriter(two.clients[US], two.name, RULES, region=US)
    assert home.add_child({**POST, "SK": "LIKE#USER#1"}).outcome == "created"
    assert home.add_child({**POST, "SK": "LIKE#USER#2"}).outcome == "created"
    two.emulator.settle()
    for region in (US, EU):
        post = two.item(region, POST)
        assert post is not None and post["likeTally"] == 2  # no increment raced, none lost


def test_a_parent_naming_no_home_takes_writes_from_every_region(two: GlobalTable) -> None:
    two.put(US, {**POST, "likeTally": 0})
    two.emulator.settle()
    writer = TallyWriter(two.clients[EU], two.name, RULES, region=EU)
    assert writer.add_child({**POST, "SK": "LIKE#USER#1"}).outcome == "created"


@pytest.mark.parametrize("strategy", ["gapless", "atomic", "sortkey"])
def test_numbers_of_a_counter_homed_in_one_region_are_handed_out_there_only(
    two: GlobalTable, strategy: str
) -> None:
    two.put(US, {**PROJECT, "lastIssue": 0, "tallyHome": US})
    two.emulator.settle()
    away = SequenceAllocator(two.clients[EU], two.name, RULES, region=EU)
    with pytest.raises(ParentHomedElsewhereError) as refused:
        away.allocate(PROJECT, strategy=strategy)  # type: ignore[arg-type]
    assert refused.value.home == US
    home = SequenceAllocator(two.clients[US], two.name, RULES, region=US)
    got = [home.allocate(PROJECT, strategy=strategy).numbers for _ in range(2)]  # type: ignore[arg-type]
    assert got == [(1,), (2,)]
    two.emulator.settle()
    members = [i for i in two.items(EU) if i["SK"].startswith("ISSUE#")]
    assert len(members) == 2 and all(m[CHILD_ID].startswith(f"{US}:") for m in members)
    counter = two.item(EU, PROJECT)
    assert counter is not None and counter["lastIssue"] == 2
