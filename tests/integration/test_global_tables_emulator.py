"""The multi-Region emulator's specification: one test per behaviour of Global Tables, run
against the emulator itself (a front per Region, a DynamoDB Local per Region), in its
deterministic mode unless the behaviour is about time. docs/global-tables.md says which of
these AWS documents and which we inferred.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.local.replication.emulator import EmulatorError
from tally.local.replication.replicator import Lag
from tally.local.replication.wire import HIDDEN, wire_key
from tests.harness.regions import AP, EU, US, GlobalTable, regional_databases, wire

POST = {"PK": "POST#1", "SK": "META"}
LIKE = {"PK": "POST#1", "SK": "LIKE#7"}


@pytest.fixture(scope="module")
def databases() -> Iterator[dict[str, str]]:
    with regional_databases() as endpoints:
        yield endpoints


@pytest.fixture
def two(databases: dict[str, str]) -> Iterator[GlobalTable]:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]})
    yield table
    table.close()


@pytest.fixture
def three(databases: dict[str, str]) -> Iterator[GlobalTable]:
    table = GlobalTable.make(databases)
    yield table
    table.close()


def post(likes: int) -> dict[str, Any]:
    return {**POST, "likes": likes}


# --- MREC: writes, last writer wins ---------------------------------------------------------


def test_a_write_applies_in_its_own_region_at_once_and_elsewhere_only_when_delivered(
    two: GlobalTable,
) -> None:
    two.put(US, post(1))
    assert two.item(US, POST) == post(1)
    assert two.item(EU, POST) is None
    assert two.deliver(US, EU, POST)
    assert two.item(EU, POST) == post(1)


def test_two_regions_adding_one_to_a_counter_at_once_keep_one_increment(two: GlobalTable) -> None:
    two.put(US, post(5))
    two.emulator.settle()
    assert two.add(US, POST, "likes")["Attributes"]["likes"] == {"N": "6"}
    assert two.add(EU, POST, "likes")["Attributes"]["likes"] == {"N": "6"}
    two.emulator.settle()
    assert two.item(US, POST) == two.item(EU, POST) == post(6)  # one +1 lost, silently


def test_the_losing_regions_stream_holds_what_it_lost_and_the_winners_holds_nothing(
    two: GlobalTable,
) -> None:
    """The evidence of a lost write is in the losing Region's stream only: the winner's
    version arrives as a MODIFY whose OldImage is the write that lost."""
    two.put(US, post(5))
    two.emulator.settle()
    two.records(US), two.records(EU)
    two.put(US, {**post(6), "by": "us"})
    two.put(EU, {**post(6), "by": "eu"})  # later: wins
    two.emulator.settle()
    us, eu = two.records(US), two.records(EU)
    assert [(r["eventName"], r["dynamodb"]["NewImage"]["by"]["S"]) for r in us] == [
        ("MODIFY", "us"),  # its own write
        ("MODIFY", "eu"),  # replaced by the winner's
    ]
    assert us[1]["dynamodb"]["OldImage"]["by"] == {"S": "us"}
    assert [r["dynamodb"]["NewImage"]["by"]["S"] for r in eu] == ["eu"]  # no trace of us's


def test_a_losing_version_changes_nothing_and_leaves_no_record_where_it_lands(
    two: GlobalTable,
) -> None:
    two.put(US, post(1))
    two.put(EU, post(2))  # later
    two.records(EU)
    assert not two.deliver(US, EU, POST)
    assert two.item(EU, POST) == post(2)
    assert two.records(EU) == []


def test_a_later_write_wins_however_late_its_delivery(two: GlobalTable) -> None:
    two.put(US, post(1))
    two.put(EU, post(2))
    assert two.deliver(EU, US, POST)  # the later one first
    assert not two.deliver(US, EU, POST)
    assert two.item(US, POST) == two.item(EU, POST) == post(2)


def test_a_region_whose_clock_runs_ahead_wins_over_later_writes(
    databases: dict[str, str],
) -> None:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]}, skew_ms={EU: 3_600_000})
    try:
        table.put(EU, post(1))  # stamped an hour ahead
        table.put(US, post(2))  # truly later
        table.emulator.settle()
        assert table.item(US, POST) == table.item(EU, POST) == post(1)
    finally:
        table.close()


def test_a_write_over_a_version_from_a_clock_running_ahead_is_stamped_after_it(
    databases: dict[str, str],
) -> None:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]}, skew_ms={US: 3_600_000})
    try:
        table.put(US, post(1))
        table.emulator.settle()
        table.put(EU, post(2))  # EU's clock is an hour behind the stamp it replaces
        hidden_us, hidden_eu = table.hidden(US, POST), table.hidden(EU, POST)
        assert hidden_eu is not None and hidden_us is not None and hidden_eu > hidden_us
        table.emulator.settle()
        assert table.item(US, POST) == table.item(EU, POST) == post(2)
    finally:
        table.close()


# --- MREC: what a Region checks, and what travels ---------------------------------------------


def test_conditions_see_only_the_local_replica_so_one_number_is_handed_out_twice(
    two: GlobalTable,
) -> None:
    """Both Regions create ticket 8 "if absent": both succeed; one child overwrites the other
    and a recount agrees."""
    ticket = {"PK": "PROJECT#1", "SK": "TICKET#8"}
    for region in (US, EU):
        two.put(region, {**ticket, "by": region}, ConditionExpression="attribute_not_exists(PK)")
    two.emulator.settle()
    assert two.item(US, ticket) == two.item(EU, ticket) == {**ticket, "by": EU}


def test_a_transaction_is_atomic_in_its_region_only_its_items_replicate_one_by_one(
    two: GlobalTable,
) -> None:
    two.clients[US].transact_write_items(
        TransactItems=[
            {"Put": {"TableName": two.name, "Item": wire(LIKE)}},
            {"Put": {"TableName": two.name, "Item": wire(post(1))}},
        ]
    )
    assert two.deliver(US, EU, LIKE)
    assert two.item(EU, LIKE) == LIKE and two.item(EU, POST) is None  # the child alone
    assert two.deliver(US, EU, POST)
    assert two.item(EU, POST) == post(1)
    assert two.hidden(US, LIKE) == two.hidden(US, POST)  # one stamp for the transaction


def test_a_transaction_sent_again_with_its_token_is_one_commit_as_in_one_region(
    two: GlobalTable,
) -> None:
    """An SDK's retry after a lost response sends the same request with the same
    ``ClientRequestToken``: DynamoDB answers it as the first, committed once. The front stamps
    the retry as the first, or DynamoDB Local would see other parameters under one token."""
    two.put(US, post(0))
    request = {
        "TransactItems": [
            {
                "Update": {
                    "TableName": two.name,
                    "Key": wire(POST),
                    "UpdateExpression": "ADD likes :one",
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                }
            }
        ],
        "ClientRequestToken": "one-like-from-a-retrying-client",
    }
    first = two.hidden(US, POST)
    two.clients[US].transact_write_items(**request)
    stamped = two.hidden(US, POST)
    two.clients[US].transact_write_items(**request)  # the retry
    assert two.item(US, POST) == post(1) and two.hidden(US, POST) == stamped != first
    request["ClientRequestToken"] = "another-like"
    two.clients[US].transact_write_items(**request)  # a new request is a new write
    assert two.item(US, POST) == post(2)


def test_changes_to_one_item_in_a_short_time_replicate_as_one(two: GlobalTable) -> None:
    for likes in (1, 2, 3):
        two.put(US, post(likes))
    two.emulator.collect()
    assert len(two.emulator.pending(US, EU)) == 1
    two.records(EU)
    assert two.deliver(US, EU, POST)
    assert [r["dynamodb"]["NewImage"]["likes"] for r in two.records(EU)] == [{"N": "3"}]
    assert two.emulator.pending(US, EU) == []


def test_order_is_kept_per_item_only(two: GlobalTable) -> None:
    two.put(US, post(1))
    two.put(US, LIKE)  # written after the post, delivered before it
    assert two.deliver(US, EU, LIKE)
    assert two.item(EU, LIKE) == LIKE and two.item(EU, POST) is None


def test_deletes_replicate_under_last_writer_wins_and_keep_their_stamp(two: GlobalTable) -> None:
    two.put(US, post(1))
    two.emulator.settle()
    two.delete(EU, POST)
    assert two.deliver(EU, US, POST)
    assert two.item(US, POST) is None
    two.put(US, post(9))  # a later write brings it back, everywhere
    two.emulator.settle()
    assert two.item(US, POST) == two.item(EU, POST) == post(9)


def test_an_older_write_arriving_after_a_delete_does_not_bring_the_item_back(
    two: GlobalTable,
) -> None:
    two.put(US, post(1))  # older
    two.emulator.collect()
    two.put(EU, post(2))
    two.delete(EU, POST)  # newer than US's write
    assert not two.deliver(US, EU, POST)
    assert two.item(EU, POST) is None
    two.emulator.settle()
    assert two.item(US, POST) is None and two.item(EU, POST) is None


def test_a_delete_in_a_transaction_keeps_its_stamp_too(two: GlobalTable) -> None:
    two.put(US, post(1))
    two.emulator.collect()
    two.put(EU, post(2))
    two.clients[EU].transact_write_items(
        TransactItems=[{"Delete": {"TableName": two.name, "Key": wire(POST)}}]
    )
    two.emulator.settle()
    assert two.item(US, POST) is None and two.item(EU, POST) is None


def test_a_newer_local_write_suppresses_an_older_one_still_on_its_way(two: GlobalTable) -> None:
    two.put(US, post(1))
    two.emulator.collect()  # on its way to EU
    two.put(EU, post(2))
    two.records(EU)
    assert not two.deliver(US, EU, POST)
    assert two.item(EU, POST) == post(2) and two.records(EU) == []


def test_an_offline_region_takes_writes_and_replays_them_when_back(two: GlobalTable) -> None:
    two.emulator.take_offline(EU)
    two.put(EU, post(2))
    two.put(US, LIKE)
    two.emulator.settle()
    assert two.item(US, POST) is None and two.item(EU, LIKE) is None  # nothing crossed
    with pytest.raises(EmulatorError, match="offline"):
        two.deliver(EU, US, POST)
    two.emulator.bring_back(EU)
    two.emulator.settle()
    assert two.items(US) == two.items(EU) == sorted([post(2), LIKE], key=lambda i: i["SK"])


def test_three_regions_each_send_their_own_writes_to_both_others_and_nothing_on(
    three: GlobalTable,
) -> None:
    three.put(AP, post(1))
    three.emulator.collect()
    assert three.emulator.pending(AP, US) and three.emulator.pending(AP, EU)
    assert three.deliver(AP, US, POST)
    three.emulator.collect()
    assert three.emulator.pending(US, EU) == []  # a replicated write is not sent on
    assert three.deliver(AP, EU, POST)
    assert all(three.item(r, POST) == post(1) for r in (US, EU, AP))


# --- what a program sees ----------------------------------------------------------------------


def test_no_answer_and_no_record_shows_the_hidden_stamp(two: GlobalTable) -> None:
    dynamodb = two.clients[EU]
    key = wire(POST)
    answers = [
        two.put(EU, post(1), ReturnValues="ALL_OLD"),
        two.add(EU, POST, "likes"),
        dynamodb.get_item(TableName=two.name, Key=key),
        dynamodb.query(
            TableName=two.name,
            KeyConditionExpression="PK = :p",
            ExpressionAttributeValues={":p": {"S": "POST#1"}},
        ),
        dynamodb.scan(TableName=two.name),
        dynamodb.batch_get_item(RequestItems={two.name: {"Keys": [key]}}),
        dynamodb.transact_get_items(TransactItems=[{"Get": {"TableName": two.name, "Key": key}}]),
        dynamodb.delete_item(TableName=two.name, Key=key, ReturnValues="ALL_OLD"),
    ]
    two.put(US, post(3))
    two.emulator.settle()
    records = two.records(EU)
    assert {r["eventName"] for r in records} == {"INSERT", "MODIFY", "REMOVE"}
    shown = repr([answers, records])
    assert all(name not in shown for name in HIDDEN)
    assert "POST#1" in shown  # the items themselves are there
    assert all(r["awsRegion"] == EU for r in records)  # the reader's Region, whoever wrote
    assert two.clients[EU].list_tables()["TableNames"] == sorted(
        set(two.clients[EU].list_tables()["TableNames"]) - {f"{two.name}.gt-tombstones"}
    )
    assert not any(n.endswith(".gt-tombstones") for n in dynamodb.list_tables()["TableNames"])


def test_a_replica_is_described_as_aws_describes_one(two: GlobalTable) -> None:
    described = two.clients[EU].describe_table(TableName=two.name)["Table"]
    assert described["Replicas"] == [{"RegionName": US, "ReplicaStatus": "ACTIVE"}]
    assert described["GlobalTableVersion"] == "2019.11.21"


def test_a_local_write_that_changes_nothing_leaves_no_record(two: GlobalTable) -> None:
    two.put(US, post(1))
    two.records(US)
    two.put(US, post(1))
    assert two.records(US) == []


def test_a_failed_condition_stamps_nothing_and_sends_nothing(two: GlobalTable) -> None:
    two.put(US, post(1))
    two.emulator.settle()
    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        two.put(EU, post(2), ConditionExpression="attribute_not_exists(PK)")
    two.emulator.collect()
    assert two.emulator.pending(EU, US) == []


def test_concurrent_writers_in_two_regions_end_with_the_same_items(two: GlobalTable) -> None:
    """Eight threads per Region add to three counters; once settled both Regions hold the
    same items, and the counters are at most what was added (increments lost, never made)."""

    def writer(region: str, n: int) -> None:
        for i in range(15):
            two.add(region, {"PK": f"POST#{(n + i) % 3}", "SK": "META"}, "likes")

    threads = [threading.Thread(target=writer, args=(r, n)) for r in (US, EU) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    two.emulator.settle()
    us, eu = two.items(US), two.items(EU)
    assert us == eu and len(us) == 3
    assert sum(i["likes"] for i in us) <= 2 * 8 * 15


# --- time: lag and its merging ----------------------------------------------------------------


def test_with_a_lag_a_change_waits_its_time_on_the_link(databases: dict[str, str]) -> None:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]}, lag=Lag(3_600_000))
    try:
        table.put(US, post(1))
        table.emulator.collect()
        assert table.emulator.pending(US, EU)
        assert table.emulator.replicator.deliver_due() == []  # due in an hour
        assert table.item(EU, POST) is None
    finally:
        table.close()


def test_with_a_short_lag_replication_runs_by_itself(databases: dict[str, str]) -> None:
    table = GlobalTable.make({US: databases[US], EU: databases[EU]}, lag=Lag(20, 200))
    try:
        for likes in range(20):
            table.put(US if likes % 2 else EU, {**post(likes), "SK": f"META#{likes}"})
        table.emulator.settle(timeout=60)
        assert table.items(US) == table.items(EU) and len(table.items(US)) == 20
    finally:
        table.close()


def test_each_link_has_its_own_lag(databases: dict[str, str]) -> None:
    table = GlobalTable.make(
        {US: databases[US], EU: databases[EU]},
        lag=Lag(0),
        link_lags={(US, EU): Lag(3_600_000)},  # an hour one way, at once the other
    )
    try:
        table.put(US, post(1))
        table.put(EU, LIKE)
        deadline = time.monotonic() + 60
        while table.item(US, LIKE) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert table.item(US, LIKE) == LIKE
        table.emulator.collect()  # us's write read too, whichever pass of the reader took eu's
        assert table.item(EU, POST) is None and table.emulator.pending(US, EU)
    finally:
        table.close()


# --- MRSC ---------------------------------------------------------------------------------------


@pytest.fixture
def strong(databases: dict[str, str]) -> Iterator[GlobalTable]:
    table = GlobalTable.make(dict.fromkeys((US, EU, AP), databases[US]), consistency="strong")
    yield table
    table.close()


def test_mrsc_a_write_is_read_at_once_in_every_region(strong: GlobalTable) -> None:
    strong.put(US, post(1))
    assert strong.item(EU, POST) == strong.item(AP, POST) == post(1)


def test_mrsc_conditions_see_every_regions_writes(strong: GlobalTable) -> None:
    strong.put(US, post(1), ConditionExpression="attribute_not_exists(PK)")
    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        strong.put(EU, post(2), ConditionExpression="attribute_not_exists(PK)")


def test_mrsc_refuses_transactions_and_ttl(strong: GlobalTable) -> None:
    dynamodb = strong.clients[EU]
    with pytest.raises(ClientError, match=r"ValidationException.*Transactions are not supported"):
        dynamodb.transact_write_items(
            TransactItems=[{"Put": {"TableName": strong.name, "Item": wire(LIKE)}}]
        )
    with pytest.raises(ClientError, match=r"ValidationException.*Transactions"):
        dynamodb.transact_get_items(
            TransactItems=[{"Get": {"TableName": strong.name, "Key": wire(LIKE)}}]
        )
    with pytest.raises(ClientError, match="Time to Live is not supported"):
        dynamodb.update_time_to_live(
            TableName=strong.name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"},
        )
    assert strong.item(US, LIKE) is None


def test_mrsc_runs_a_transaction_on_regional_tables_only_and_refuses_one_that_touches_it(
    strong: GlobalTable,
) -> None:
    """A table of the Region's own (an audit table: never replicated) takes transactions on an
    MRSC stack; a transaction that also names the MRSC table is refused whole."""
    dynamodb = strong.clients[EU]
    regional = f"{strong.name}-audit"
    dynamodb.create_table(
        TableName=regional,
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    first, second = {"PK": {"S": "LOG#1"}}, {"PK": {"S": "LOG#2"}}
    dynamodb.transact_write_items(
        TransactItems=[{"Put": {"TableName": regional, "Item": i}} for i in (first, second)]
    )
    read = dynamodb.transact_get_items(
        TransactItems=[{"Get": {"TableName": regional, "Key": first}}]
    )
    assert read["Responses"] == [{"Item": first}]
    dynamodb.execute_transaction(
        TransactStatements=[{"Statement": f"INSERT INTO \"{regional}\" VALUE {{'PK': 'LOG#3'}}"}]
    )
    with pytest.raises(ClientError, match=r"ValidationException.*Transactions are not supported"):
        dynamodb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": regional, "Item": {"PK": {"S": "LOG#4"}}}},
                {"Put": {"TableName": strong.name, "Item": wire(LIKE)}},
            ]
        )
    held = dynamodb.scan(TableName=regional, ConsistentRead=True)["Items"]
    assert sorted(i["PK"]["S"] for i in held) == ["LOG#1", "LOG#2", "LOG#3"]
    assert strong.item(US, LIKE) is None


def test_mrsc_a_write_racing_another_regions_write_to_the_item_is_refused(
    databases: dict[str, str], request: pytest.FixtureRequest
) -> None:
    """A write's replication to the other Regions is emulated as a window after it answered
    (here a minute, so the race is certain); another Region's write to the item within it is
    refused, the same Region's is not."""
    strong = GlobalTable.make(
        dict.fromkeys((US, EU, AP), databases[US]), consistency="strong", conflict_window_ms=60_000
    )
    request.addfinalizer(strong.close)
    strong.add(US, POST, "likes")
    strong.add(US, POST, "likes")  # the same Region again: no race
    with pytest.raises(ClientError) as refused:
        strong.add(EU, POST, "likes")
    assert refused.value.response["Error"]["Code"] == "ReplicatedWriteConflictException"
    strong.add(EU, LIKE, "n")  # another item: no race
    assert strong.item(AP, POST) == {**POST, "likes": Decimal(2)}


def test_mrsc_loses_no_acknowledged_increment_under_concurrent_writers(
    strong: GlobalTable,
) -> None:
    """Four threads per Region add to one counter: every acknowledged ADD is counted, the
    racing ones are refused (never applied)."""
    acknowledged = []

    def writer(region: str) -> None:
        for _ in range(10):
            try:
                strong.add(region, POST, "likes")
                acknowledged.append(region)
            except ClientError as exc:
                assert exc.response["Error"]["Code"] == "ReplicatedWriteConflictException"

    threads = [threading.Thread(target=writer, args=(r,)) for r in (US, EU, AP) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert acknowledged
    assert strong.item(EU, POST) == {**POST, "likes": Decimal(len(acknowledged))}


def test_mrsc_needs_three_regions_and_one_database(databases: dict[str, str]) -> None:
    with pytest.raises(EmulatorError, match="exactly three"):
        GlobalTable.make(dict.fromkeys((US, EU), databases[US]), consistency="strong")
    with pytest.raises(EmulatorError, match="one database"):
        GlobalTable.make(databases, consistency="strong")


# --- convergence, over any interleaving --------------------------------------------------------

REGIONS = (US, EU, AP)
KEYS = [{"PK": "P", "SK": s} for s in ("A", "B")]
step = st.one_of(
    st.tuples(
        st.just("put"), st.sampled_from(REGIONS), st.sampled_from(range(2)), st.integers(0, 9)
    ),
    st.tuples(st.just("delete"), st.sampled_from(REGIONS), st.sampled_from(range(2)), st.none()),
    st.tuples(
        st.just("add"), st.sampled_from(REGIONS), st.sampled_from(range(2)), st.integers(1, 3)
    ),
    st.tuples(
        st.just("deliver"), st.sampled_from(REGIONS), st.sampled_from(REGIONS), st.integers(0, 1)
    ),
    st.tuples(st.just("offline"), st.sampled_from(REGIONS), st.none(), st.none()),
    st.tuples(st.just("online"), st.sampled_from(REGIONS), st.none(), st.none()),
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(plan=st.lists(step, max_size=14))
def test_once_every_link_delivered_everything_every_region_holds_the_latest_version(
    databases: dict[str, str], plan: list[tuple[str, Any, Any, Any]]
) -> None:
    """Each write's stamp is read behind the front as it is made; once settled every Region
    holds, per item, the version with the latest stamp (absent if that was a deletion)."""
    table = GlobalTable.make(databases)
    written: dict[int, list[tuple[Any, bool]]] = {0: [], 1: []}  # (stamp, deleted)
    emulator = table.emulator
    try:
        for action, region, a, b in plan:
            if action == "put":
                table.put(region, {**KEYS[a], "v": b})
                written[a].append((table.hidden(region, KEYS[a]), False))
            elif action == "add":
                table.add(region, KEYS[a], "v", b)
                written[a].append((table.hidden(region, KEYS[a]), False))
            elif action == "delete":
                table.delete(region, KEYS[a])
                written[a].append((table.tombstone(region, KEYS[a]), True))
            elif action == "deliver" and region != a and not {region, a} & emulator.offline:
                emulator.collect()
                if (table.name, wire_key(wire(KEYS[b]))) in emulator.pending(region, a):
                    table.deliver(region, a, KEYS[b])
            elif action == "offline":
                emulator.take_offline(region)
            elif action == "online":
                emulator.bring_back(region)
        for region in REGIONS:
            emulator.bring_back(region)
        emulator.settle()
        held = {r: table.items(r) for r in REGIONS}
        assert held[US] == held[EU] == held[AP]
        for index, key in enumerate(KEYS):
            if not written[index]:
                assert table.item(US, key) is None
                continue
            latest, deleted = max(written[index], key=lambda w: w[0])
            for region in REGIONS:
                if deleted:
                    assert table.item(region, key) is None
                else:
                    assert table.hidden(region, key) == latest
    finally:
        table.close()
