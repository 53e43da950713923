"""The writers on a multi-Region strongly consistent (MRSC) Global Table: three emulated
Regions on the strong profile (one DynamoDB Local behind a front per Region, transactions
refused, racing writes refused with ReplicatedWriteConflictException), writers in real
threads in every Region (``consistency="strong"``)."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError

import tally.writers.mrsc_tallies as mrsc_tallies
from tally.core.regions import CHILD_ID, ORIGIN, writes
from tally.local.dynamodb_local import DynamoDBLocal
from tally.rules import load_rules
from tally.writers import (
    InvalidRequestError,
    ParentNotFoundError,
    SequenceAllocator,
    TallyWriter,
)
from tally.writers.mrsc import MARK
from tests.harness.faults import Faults
from tests.harness.regions import AP, EU, US, GlobalTable
from tests.integration.conftest import RULES_FILE

RULES = load_rules(RULES_FILE)
REGIONS = (US, EU, AP)
POST = {"PK": "POST#1", "SK": "META"}
ORDER = {"PK": "ORDER#1", "SK": "META"}
PROJECT = {"PK": "PROJECT#1", "SK": "COUNTER#ISSUE"}
WRITES = ("PutItem", "UpdateItem", "DeleteItem")


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    local = DynamoDBLocal().start()
    yield local.endpoint
    local.stop()


class Region:
    """One Region's client as a program would hold it (standard retries), and what was
    seen on it: transactions attempted, conflicts answered, answers lost after commit."""

    def __init__(self, table: GlobalTable, region: str, lose: float = 0.0, seed: int = 0):
        self.region = region
        self.client = boto3.client(
            "dynamodb",
            endpoint_url=table.emulator.endpoint(region),
            region_name=region,
            aws_access_key_id="local",
            aws_secret_access_key="local",
            config=Config(retries={"mode": "standard", "max_attempts": 5}),
        )
        self.transactions: list[str] = []
        self.conflicts = 0
        self.lost = 0
        self._lose = lose
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        events = self.client.meta.events
        for operation in ("TransactWriteItems", "TransactGetItems", "ExecuteTransaction"):
            events.register(f"before-call.dynamodb.{operation}", self._no_transaction)
        events.register("needs-retry.dynamodb", self._count_conflict)
        for operation in WRITES:
            events.register(f"after-call.dynamodb.{operation}", self._lose_after_commit)

    def _no_transaction(self, model: Any, **_: Any) -> None:
        self.transactions.append(model.name)
        raise AssertionError(f"{model.name} attempted on MRSC")

    def _count_conflict(self, response: Any = None, **_: Any) -> None:
        if response is not None and response[1].get("Error", {}).get("Code") == (
            "ReplicatedWriteConflictException"
        ):
            with self._lock:
                self.conflicts += 1

    def _lose_after_commit(self, http_response: Any, model: Any, **_: Any) -> None:
        """The write committed (200); its answer never reaches the writer."""
        if http_response.status_code != 200:
            return
        with self._lock:
            lose = self._random.random() < self._lose
            self.lost += lose
        if lose:
            raise ConnectionClosedError(endpoint_url=f"lost {model.name} answer")


@pytest.fixture
def strong(database: str) -> Iterator[GlobalTable]:
    table = GlobalTable.make(dict.fromkeys(REGIONS, database), consistency="strong")
    yield table
    table.close()


def regions(table: GlobalTable, lose: float = 0.0) -> dict[str, Region]:
    return {r: Region(table, r, lose, seed=i) for i, r in enumerate(REGIONS)}


def likes(table: GlobalTable) -> list[dict[str, Any]]:
    return [i for i in table.items(US) if i["PK"] == POST["PK"] and i["SK"].startswith("LIKE#")]


def tally_writer(table: GlobalTable, region: Region) -> TallyWriter:
    return TallyWriter(region.client, table.name, RULES, region=region.region, consistency="strong")


def race_likes(table: GlobalTable, sides: dict[str, Region], threads: int, calls: int) -> Counter:
    """Threads in every Region like and unlike 12 children of one post at random."""
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def work(index: int) -> None:
        region = sides[REGIONS[index % 3]]
        writer = tally_writer(table, region)
        pick = random.Random(index)
        for _ in range(calls):
            key = {"PK": POST["PK"], "SK": f"LIKE#{pick.randrange(12)}"}
            if pick.random() < 0.6:
                result = writer.add_child(key, {"user": f"u{index}"})
            else:
                result = writer.remove_child(key)
            with lock:
                outcomes[result.outcome] += 1

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    return outcomes


def test_every_acknowledged_like_is_counted_once_while_three_regions_race_one_parent(
    strong: GlobalTable,
) -> None:
    """Twelve threads, four per Region, on one post: the Regions' writes to the post race and
    are refused (conflicts), retried, and every acknowledged like and unlike is counted once;
    no transaction is ever attempted."""
    strong.put(US, POST)
    sides = regions(strong)
    outcomes = race_likes(strong, sides, threads=12, calls=15)
    post = strong.item(AP, POST)
    assert post is not None
    assert post["likeTally"] == len(likes(strong)) == outcomes["created"] - outcomes["removed"]
    assert outcomes["created"] and outcomes["removed"]
    assert sum(side.conflicts for side in sides.values()) > 0
    assert [side.transactions for side in sides.values()] == [[], [], []]
    assert post["tallyRevision"] == outcomes["created"] + outcomes["removed"]


def test_a_lost_answer_after_commit_is_sent_again_and_not_counted_twice(
    strong: GlobalTable,
) -> None:
    """A third of the committed writes lose their answer on the way back (the writer sends
    them again), and a third of all attempts lose it inside botocore (botocore resends), in
    every Region at once: the counter still equals the children and what the calls said."""
    strong.put(US, POST)
    sides = regions(strong, lose=0.3)
    faults = [
        Faults(side.client, lost=0.3, seed=i, operations=set(WRITES))
        for i, side in enumerate(sides.values())
    ]
    for fault in faults:
        fault.__enter__()
    try:
        outcomes = race_likes(strong, sides, threads=6, calls=25)
    finally:
        for fault in faults:
            fault.__exit__(None, None, None)
    post = strong.item(US, POST)
    assert post is not None
    assert post["likeTally"] == len(likes(strong)), outcomes
    # A remove that lost its answers and found the child gone may say removed for another's.
    assert outcomes["created"] - outcomes["removed"] <= len(likes(strong)), outcomes
    assert sum(side.lost for side in sides.values()) > 10
    assert sum(fault.total().lost for fault in faults) > 10


def test_a_sum_changed_and_removed_with_answers_lost_keeps_its_total(
    strong: GlobalTable,
) -> None:
    strong.put(US, ORDER)
    side = regions(strong, lose=1.0)[EU]  # every committed write's answer is lost once...
    writer = tally_writer(strong, side)
    line = {"PK": "ORDER#1", "SK": "LINE#1"}
    assert writer.add_child(line, {"amount": Decimal("2.50")}).outcome == "created"
    assert writer.change_amount(line, Decimal("4.25")).outcome == "changed"
    assert strong.item(US, ORDER)["total"] == Decimal("4.25")  # type: ignore[index]
    assert writer.remove_child(line).outcome == "removed"
    assert strong.item(US, ORDER)["total"] == 0  # type: ignore[index]
    assert side.lost >= 6  # ...and the resends' too, until the writer gives up on it


def test_a_crash_between_child_and_counter_leaves_the_counter_behind_after_an_add_and_ahead_after_a_remove(  # noqa: E501
    strong: GlobalTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    added, removed = {"PK": "POST#1", "SK": "META"}, {"PK": "POST#2", "SK": "META"}
    strong.put(US, added)
    strong.put(US, removed)
    writer = tally_writer(strong, regions(strong)[US])
    gone = {"PK": "POST#2", "SK": "LIKE#1"}
    assert writer.add_child(gone).outcome == "created"

    def crash(*_: Any, **__: Any) -> int:
        raise SystemExit("the process died between the child and the counter")

    monkeypatch.setattr(mrsc_tallies, "count", crash)
    with pytest.raises(SystemExit):
        writer.add_child({"PK": "POST#1", "SK": "LIKE#1"})
    with pytest.raises(SystemExit):
        writer.remove_child(gone)
    assert strong.item(EU, {"PK": "POST#1", "SK": "LIKE#1"}) is not None
    assert "likeTally" not in strong.item(EU, added)  # type: ignore[operator]  # behind: 0 < 1
    assert strong.item(EU, gone) is None
    assert strong.item(EU, removed)["likeTally"] == 1  # type: ignore[index]  # ahead: 1 > 0


def test_a_refused_counter_takes_the_child_back(strong: GlobalTable) -> None:
    writer = tally_writer(strong, regions(strong)[AP])
    with pytest.raises(ParentNotFoundError):
        writer.add_child({"PK": "POST#9", "SK": "LIKE#1"})
    assert strong.items(US) == []


def test_writes_carry_the_regional_stamps(strong: GlobalTable) -> None:
    strong.put(US, POST)
    sides = regions(strong)
    tally_writer(strong, sides[EU]).add_child({"PK": "POST#1", "SK": "LIKE#1"})
    tally_writer(strong, sides[AP]).add_child({"PK": "POST#1", "SK": "LIKE#2"})
    tally_writer(strong, sides[AP]).remove_child({"PK": "POST#1", "SK": "LIKE#1"})
    post = strong.item(US, POST)
    assert post is not None
    assert (post[ORIGIN], post[writes(EU)], post[writes(AP)]) == (AP, 1, 2)
    [child] = likes(strong)
    assert child[ORIGIN] == AP and child[CHILD_ID].startswith(f"{AP}:")


def test_what_needs_a_transaction_is_refused_before_anything_is_written(
    strong: GlobalTable,
) -> None:
    strong.put(US, POST)
    strong.put(US, PROJECT)
    side = regions(strong)[US]
    writer = tally_writer(strong, side)
    allocator = SequenceAllocator(side.client, strong.name, RULES, consistency="strong")
    like = {"PK": "POST#1", "SK": "LIKE#1"}
    with pytest.raises(InvalidRequestError, match="idempotency key") as refused:
        writer.add_child(like, idempotency_key="k1")
    assert refused.value.field == ("idempotency_key",)
    with pytest.raises(InvalidRequestError) as refused:
        writer.add_child(like, {MARK: "forged"})
    assert refused.value.field == ("attributes", MARK)
    for strategy in ("sortkey", "block"):
        with pytest.raises(InvalidRequestError) as refused:
            allocator.allocate(PROJECT, strategy=strategy)  # type: ignore[arg-type]
        assert refused.value.field == ("strategy",)
    with pytest.raises(ValueError, match="consistency"):
        TallyWriter(side.client, strong.name, RULES, consistency="STRONG")  # type: ignore[arg-type]
    assert likes(strong) == [] and side.transactions == []


@pytest.mark.parametrize("strategy", ["gapless", "atomic"])
def test_no_number_is_handed_out_twice_by_threads_in_three_regions(
    strong: GlobalTable, strategy: str
) -> None:
    strong.put(US, PROJECT)
    sides = regions(strong, lose=0.2 if strategy == "gapless" else 0.0)

    def work(index: int) -> list[int]:
        side = sides[REGIONS[index % 3]]
        allocator = SequenceAllocator(
            side.client, strong.name, RULES, region=side.region, consistency="strong"
        )
        return [allocator.allocate(PROJECT, strategy=strategy).numbers[0] for _ in range(12)]  # type: ignore[arg-type]

    with ThreadPoolExecutor(6) as pool:
        numbers = [n for got in pool.map(work, range(6)) for n in got]
    members = [i for i in strong.items(US) if i["SK"].startswith("ISSUE#")]
    assert len(numbers) == len(set(numbers)) == 72
    # No gap either: nothing crashed, and gapless lost no number to a lost answer.
    assert sorted(numbers) == list(range(1, 73))
    assert sorted(int(m["SK"].removeprefix("ISSUE#")) for m in members) == sorted(numbers)
    assert strong.item(EU, PROJECT)["lastIssue"] == 72  # type: ignore[index]
    assert sum(side.conflicts for side in sides.values()) > 0
    assert [side.transactions for side in sides.values()] == [[], [], []]


def test_a_gapless_crash_between_member_and_counter_is_caught_up_by_the_next_allocation(
    strong: GlobalTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    strong.put(US, PROJECT)
    side = regions(strong)[EU]
    allocator = SequenceAllocator(side.client, strong.name, RULES, consistency="strong")
    assert allocator.allocate(PROJECT).numbers == (1,)
    advance = allocator._advance

    def crash(*_: Any) -> Any:
        raise SystemExit("died after the member, before the counter")

    monkeypatch.setattr(allocator, "_advance", crash)
    with pytest.raises(SystemExit):
        allocator.allocate(PROJECT)
    assert strong.item(US, PROJECT)["lastIssue"] == 1  # type: ignore[index]  # behind its members
    monkeypatch.setattr(allocator, "_advance", advance)
    assert allocator.allocate(PROJECT).numbers == (3,)
    assert strong.item(US, PROJECT)["lastIssue"] == 3  # type: ignore[index]


# --- the races a lost answer opens, one at a time ---------------------------------------------


def once(client: Any, event: str, action: Any) -> None:
    """On the client's first ``event``, run ``action`` (another Region's call) first."""
    fired: list[bool] = []

    def hook(**kwargs: Any) -> None:
        if not fired:
            fired.append(True)
            action(**kwargs)

    client.meta.events.register(event, hook)


def test_a_like_removed_by_another_region_before_a_lost_answers_resend_is_not_made_again(
    strong: GlobalTable,
) -> None:
    """us puts the like; its answer is lost; eu removes the like (child and count) before us
    looks: us finds its like's removal on the post and counts its like, never puts it again."""
    strong.put(US, POST)
    sides = regions(strong)
    like = {"PK": "POST#1", "SK": "LIKE#1"}
    eu = tally_writer(strong, sides[EU])

    def removed_then_lost(http_response: Any, **_: Any) -> None:
        assert eu.remove_child(like).outcome == "removed"
        raise ConnectionClosedError(endpoint_url="lost PutItem answer")

    once(sides[US].client, "after-call.dynamodb.PutItem", removed_then_lost)
    assert tally_writer(strong, sides[US]).add_child(like).outcome == "created"
    assert likes(strong) == []
    assert strong.item(AP, POST)["likeTally"] == 0  # type: ignore[index]


def test_two_regions_removing_one_like_take_it_off_the_count_once(strong: GlobalTable) -> None:
    """us reads the like, its Delete fails to go out; eu removes the like; us's resend finds
    it gone and, as its first send may have been written, counts it removed: under the
    like's own token, which eu's decrement already carried, so the post loses it once."""
    strong.put(US, POST)
    sides = regions(strong)
    like = {"PK": "POST#1", "SK": "LIKE#1"}
    tally_writer(strong, sides[AP]).add_child(like)
    eu = tally_writer(strong, sides[EU])

    def removed_elsewhere(request: Any, **_: Any) -> None:
        assert eu.remove_child(like).outcome == "removed"
        raise EndpointConnectionError(endpoint_url=request.url)

    once(sides[US].client, "before-send.dynamodb.DeleteItem", removed_elsewhere)
    assert tally_writer(strong, sides[US]).remove_child(like).outcome == "removed"
    assert strong.item(AP, POST)["likeTally"] == 0  # type: ignore[index]


def test_a_like_made_again_before_a_lost_removals_resend_stays_counted(
    strong: GlobalTable,
) -> None:
    """us removes the like, its answer is lost; eu likes again; us's resend finds another
    like (another token) in its place: the removal it made is counted, the new like kept."""
    strong.put(US, POST)
    sides = regions(strong)
    like = {"PK": "POST#1", "SK": "LIKE#1"}
    tally_writer(strong, sides[AP]).add_child(like)
    eu = tally_writer(strong, sides[EU])

    def liked_again_then_lost(**_: Any) -> None:
        assert eu.add_child(like).outcome == "created"
        raise ConnectionClosedError(endpoint_url="lost DeleteItem answer")

    once(sides[US].client, "after-call.dynamodb.DeleteItem", liked_again_then_lost)
    assert tally_writer(strong, sides[US]).remove_child(like).outcome == "removed"
    assert len(likes(strong)) == 1
    assert strong.item(AP, POST)["likeTally"] == 1  # type: ignore[index]
