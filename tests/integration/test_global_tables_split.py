"""A counter split per Region on a Global Table (docs/global-tables.md, "Counters split per
Region"): each Region's writers add to a shard item of their own beside the parent, so last
writer wins, which keeps one version per item, never drops an increment; the count is the
parent's base plus its shards, verified as such from the home Region.

Driven as a user drives it: `tally local up --regions --rules`, the project's writers in each
Region on real threads, `tally pump` (each Region's real handler), `tally alerts`. The race is
made certain, not timed: the second Region is cut off while both write, then brought back.
The repair's fence is tested deterministically on one DynamoDB Local: a shard write lands
between the judgement and the repair, and the repair's condition fails."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tally.local.stack_record import load
from tally.reconciler.table.tally_table import TallyTable
from tally.rules import load_rules
from tally.writers import (
    InvalidRequestError,
    ParentHomedElsewhereError,
    ParentNotFoundError,
    TallyWriter,
)
from tests.harness.live_regions import items, regional_client
from tests.integration.test_cli import clean_env, tally
from tests.integration.test_local_regions import emulator

pytestmark = pytest.mark.serial

US, EU = "us-east-1", "eu-west-1"
RULES_FILE = Path(__file__).with_name("split_rules.toml")
RULES = load_rules(RULES_FILE)
SPLIT, PLAIN = "SPLITPOST#race", "POST#race"
LIKES_PER_THREAD = 6


def total(held: dict[tuple[str, str], dict[str, Any]], pk: str) -> Decimal:
    """What a split parent counts: its base (its own likeTally) and every shard's."""
    parts = [i for (p, sk), i in held.items() if p == pk and (sk == "META" or "#REGION#" in sk)]
    return sum((Decimal(i.get("likeTally", 0)) for i in parts), Decimal(0))


def children(held: dict[tuple[str, str], dict[str, Any]], pk: str) -> int:
    return sum(1 for p, sk in held if p == pk and sk.startswith("LIKE#"))


@pytest.fixture(scope="module")
def regions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Any]]:
    env = clean_env(tmp_path_factory.mktemp("split"))
    tally(
        "local", "up", "--regions", f"{US},{EU}", "--lag-ms", "0", "--rules", str(RULES_FILE),
        env=env,
    )  # fmt: skip
    try:
        stack = load(Path(env["TALLY_STATE_DIR"]))
        assert stack is not None
        yield env, stack
    finally:
        tally("local", "down", env=env)


def alerts(env: dict[str, str]) -> list[dict[str, Any]]:
    return [json.loads(a) for a in tally("alerts", "--json", env=env).stdout.splitlines()]


def test_likes_from_two_regions_at_once_lose_no_increment_when_the_counter_is_split(
    regions: tuple[dict[str, str], Any],
) -> None:
    env, stack = regions
    us, eu = (stack.in_region(r) for r in (US, EU))
    for pk in (SPLIT, PLAIN):
        regional_client(us).put_item(
            TableName=us.table_name,
            Item={"PK": {"S": pk}, "SK": {"S": "META"}, "likeTally": {"N": "0"}},
        )
    emulator(stack, "settle", {"timeout": 60})
    emulator(stack, "offline", {"region": EU})  # both Regions write; neither sees the other's

    def like(region: Any, thread: int) -> None:
        client = regional_client(region)
        writer = TallyWriter(client, region.table_name, RULES, region=region.region)
        for n in range(LIKES_PER_THREAD):
            for pk in (SPLIT, PLAIN):
                like = {"PK": pk, "SK": f"LIKE#{region.region}#{thread}#{n}"}
                assert writer.add_child(like).outcome == "created"

    threads = [threading.Thread(target=like, args=(s, t)) for s in (us, eu) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    emulator(stack, "online", {"region": EU})
    emulator(stack, "settle", {"timeout": 60})
    made = 4 * LIKES_PER_THREAD
    for region in (us, eu):
        held = items(region)
        assert children(held, SPLIT) == children(held, PLAIN) == made
        assert total(held, SPLIT) == made  # every increment kept, in every Region
        assert held[(SPLIT, f"META#REGION#{US}")]["likeTally"] == made / 2
        assert held[(SPLIT, f"META#REGION#{EU}")]["likeTally"] == made / 2
        assert held[(SPLIT, "META")]["likeTally"] == 0  # the base: writers leave it
        # Unsplit, one Region's version of the one counter replaced the other's.
        assert held[(PLAIN, "META")]["likeTally"] == made / 2
    tally("pump", "--until-settled", env=env)
    found = [(a["kind"], a["region"], a["key"]["PK"]) for a in alerts(env)]
    assert found == [("drift", US, PLAIN)], found  # the split post: nothing to alert


def test_a_rogue_write_to_one_shard_is_alerted_once_from_home_and_repaired_in_the_home_shard(
    regions: tuple[dict[str, str], Any],
) -> None:
    env, stack = regions
    us, eu = (stack.in_region(r) for r in (US, EU))
    emulator(stack, "settle", {"timeout": 60})
    tally("pump", "--until-settled", env=env)
    before = alerts(env)
    made = 4 * LIKES_PER_THREAD
    assert total(items(eu), SPLIT) == made
    # An outsider adds 5 to Eu's shard (no writer's stamps, no child).
    regional_client(eu).update_item(
        TableName=eu.table_name,
        Key={"PK": {"S": SPLIT}, "SK": {"S": f"META#REGION#{EU}"}},
        UpdateExpression="ADD likeTally :five",
        ExpressionAttributeValues={":five": {"N": "5"}},
    )
    emulator(stack, "settle", {"timeout": 60})
    tally("pump", "--until-settled", env=env)
    new = [a for a in alerts(env) if a not in before]
    assert [(a["kind"], a["region"], a["key"]["PK"]) for a in new] == [("drift", US, SPLIT)], new
    [alert] = new
    assert alert["repair"]["status"] == "applied"
    assert (alert["stored"], alert["actual"]) == (made + 5, made)
    assert f"{EU}: {made // 2 + 5}" in alert["detail"]  # the shards' values, named
    emulator(stack, "settle", {"timeout": 60})
    for region in (us, eu):
        held = items(region)
        assert total(held, SPLIT) == children(held, SPLIT) == made
        # Repaired in the home Region's own shard; no other Region's shard written.
        assert held[(SPLIT, f"META#REGION#{US}")]["likeTally"] == made // 2 - 5
        assert held[(SPLIT, f"META#REGION#{EU}")]["likeTally"] == made // 2 + 5
        assert held[(SPLIT, "META")]["likeTally"] == 0


# --- the repair's fence, deterministically, on one DynamoDB Local ------------------------


@pytest.fixture
def split_table(dynamodb: Any, table_name: str) -> tuple[Any, str]:
    return dynamodb, table_name


def _likes(client: Any, table: str, region: str, n: int, post: str, first: int = 0) -> None:
    writer = TallyWriter(client, table, RULES, region=region)
    for i in range(first, first + n):
        assert writer.add_child({"PK": post, "SK": f"LIKE#{region}#{i}"}).outcome == "created"


@pytest.mark.parametrize("landing", ["existing shard", "new shard", "parent gone", "nothing"])
def test_a_write_landing_between_judgement_and_repair_fails_the_repairs_condition(
    split_table: tuple[Any, str], landing: str
) -> None:
    client, table = split_table
    post = f"SPLITPOST#{landing.replace(' ', '-')}"
    client.put_item(
        TableName=table, Item={"PK": {"S": post}, "SK": {"S": "META"}, "likeTally": {"N": "3"}}
    )  # a base of 3 with no children: 3 too many
    _likes(client, table, US, 2, post)
    if landing != "new shard":
        _likes(client, table, EU, 1, post)
    rule = RULES["split-likes"]
    access = TallyTable(client, table, RULES)
    key = {"PK": post, "SK": "META"}
    judged = access.parents.read_parent(rule, key)
    truth = access.parents.tally_children(rule, key).actual
    assert (judged.counter, truth) == ((5, 2) if landing == "new shard" else (6, 3))
    if landing in ("existing shard", "new shard"):
        _likes(client, table, EU, 1, post, first=1)  # between the read and the write
    elif landing == "parent gone":
        client.delete_item(TableName=table, Key={"PK": {"S": post}, "SK": {"S": "META"}})
    shards = {
        sk: i.get("likeTally")
        for i in _collection(client, table, post)
        if "#REGION#" in (sk := i["SK"]["S"])
    }
    written = access.writes.set_counter(
        rule, key, judged, truth, "r:test", [], shard_region=US, regions=(US, EU)
    )
    after = {
        sk: i.get("likeTally")
        for i in _collection(client, table, post)
        if "#REGION#" in (sk := i["SK"]["S"])
    }
    if landing == "nothing":
        assert written
        assert access.parents.read_parent(rule, key).counter == truth
        assert after[f"META#REGION#{US}"] == {"N": "-1"}  # 2 - 3: the base's 3 taken off
    else:
        assert not written and after == shards  # no harmful write: nothing changed


def _collection(client: Any, table: str, pk: str) -> list[dict[str, Any]]:
    return client.query(
        TableName=table,
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": pk}},
        ConsistentRead=True,
    )["Items"]


# --- the writers of a split counter, on one DynamoDB Local -------------------------------


def _item(client: Any, table: str, pk: str, sk: str) -> dict[str, Any] | None:
    found = client.get_item(
        TableName=table, Key={"PK": {"S": pk}, "SK": {"S": sk}}, ConsistentRead=True
    )
    return found.get("Item")


def test_a_writer_adds_and_removes_on_its_own_regions_shard_and_leaves_the_parent(
    split_table: tuple[Any, str],
) -> None:
    client, table = split_table
    post = "SPLITPOST#writers"
    client.put_item(
        TableName=table,
        Item={"PK": {"S": post}, "SK": {"S": "META"}, "likeTally": {"N": "2"}},
    )
    us, eu = (TallyWriter(client, table, RULES, region=r) for r in (US, EU))
    assert us.add_child({"PK": post, "SK": "LIKE#a"}).outcome == "created"
    assert us.add_child({"PK": post, "SK": "LIKE#b"}).outcome == "created"
    assert eu.remove_child({"PK": post, "SK": "LIKE#a"}).outcome == "removed"  # made in us
    assert eu.remove_child({"PK": post, "SK": "LIKE#a"}).outcome == "not_present"
    assert us.add_child({"PK": post, "SK": "LIKE#b"}).outcome == "already_present"
    shard = {r: _item(client, table, post, f"META#REGION#{r}") for r in (US, EU)}
    assert shard[US] is not None and shard[EU] is not None
    assert (shard[US]["likeTally"], shard[EU]["likeTally"]) == ({"N": "2"}, {"N": "-1"})
    assert (shard[US]["tallyOrigin"], shard[EU]["tallyOrigin"]) == ({"S": US}, {"S": EU})
    parent = _item(client, table, post, "META")
    assert parent is not None and parent["likeTally"] == {"N": "2"}  # the base, untouched
    assert "tallyOrigin" not in parent and "tallyRevision" not in parent
    rule = RULES["split-likes"]
    state = TallyTable(client, table, RULES).parents.read_parent(rule, {"PK": post, "SK": "META"})
    assert state.counter == 3  # 2 + 2 - 1: the base's 2, and one child


def test_a_sum_writer_moves_amounts_on_its_own_regions_shard(split_table: tuple[Any, str]) -> None:
    client, table = split_table
    order = "SPLITORDER#1"
    client.put_item(TableName=table, Item={"PK": {"S": order}, "SK": {"S": "META"}})
    us, eu = (TallyWriter(client, table, RULES, region=r) for r in (US, EU))
    line = {"PK": order, "SK": "LINE#1"}
    assert us.add_child(line, {"amount": Decimal("12.50")}).outcome == "created"
    assert eu.change_amount(line, Decimal("10.25")).outcome == "changed"
    key = {"PK": order, "SK": "META"}
    state = TallyTable(client, table, RULES).parents.read_parent(RULES["split-order-total"], key)
    assert (state.counter, state.shards) == (
        Decimal("10.25"),
        ((EU, Decimal("-2.25")), (US, Decimal("12.5"))),
    )


def test_a_retry_under_an_idempotency_key_counts_once(split_table: tuple[Any, str]) -> None:
    client, table = split_table
    post = "SPLITPOST#keyed"
    client.put_item(TableName=table, Item={"PK": {"S": post}, "SK": {"S": "META"}})
    writer = TallyWriter(client, table, RULES, region=US)
    like = {"PK": post, "SK": "LIKE#a"}
    first = writer.add_child(like, idempotency_key="k1")
    again = writer.add_child(like, idempotency_key="k1")
    assert (first.outcome, first.replayed, again.outcome, again.replayed) == (
        "created",
        False,
        "created",
        True,
    )
    shard = _item(client, table, post, f"META#REGION#{US}")
    assert shard is not None and shard["likeTally"] == {"N": "1"}


def test_a_split_write_is_refused_without_a_region_a_parent_or_at_home_elsewhere(
    split_table: tuple[Any, str],
) -> None:
    client, table = split_table
    post = "SPLITPOST#refused"
    like = {"PK": post, "SK": "LIKE#a"}
    with pytest.raises(InvalidRequestError, match="splits its counter per Region"):
        TallyWriter(client, table, RULES).add_child(like)
    writer = TallyWriter(client, table, RULES, region=EU)
    with pytest.raises(ParentNotFoundError):
        writer.add_child(like)
    client.put_item(
        TableName=table,
        Item={"PK": {"S": post}, "SK": {"S": "META"}, "tallyHome": {"S": US}},
    )
    with pytest.raises(ParentHomedElsewhereError) as homed:
        writer.add_child(like)
    assert homed.value.home == US
    # Nothing written by any of them: no child, no shard.
    assert _item(client, table, post, "LIKE#a") is None
    assert _item(client, table, post, f"META#REGION#{EU}") is None
    assert TallyWriter(client, table, RULES, region=US).add_child(like).outcome == "created"
