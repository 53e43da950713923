"""The audit store against moto: findings, standing slots, the outbox, markers, watermarks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from tally.core.dynamodb import serialize
from tally.local.template import create_table, load_template, template_path
from tally.reconciler.findings import AlertMessage, Finding, Repair
from tally.reconciler.protocol.carry import Carry
from tally.reconciler.protocol.window import Noted
from tally.reconciler.store.outbox import LEASE_SECONDS
from tally.reconciler.store.parts import Store

TABLE = "audit"
KEY = {"PK": "POST#a91f", "SK": "META"}


class Clock:
    """A settable clock, so expiry is tested without sleeping."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("dynamodb")
        create_table(client, load_template(template_path()), "AuditTable", TABLE)
        yield client


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(client: Any, clock: Clock) -> Store:
    return Store(client, TABLE, clock)


def drift(stored: int = 7, actual: int = 5, **overrides: Any) -> Finding:
    fields: dict[str, Any] = {
        "kind": "drift",
        "rule": "likes",
        "table": "t",
        "key": KEY,
        "attribute": "likeTally",
        "stored": Decimal(stored),
        "actual": Decimal(actual),
    }
    return Finding(**(fields | overrides))


def record(store: Store, finding: Finding) -> None:
    assert store.outbox.enqueue([store.log.finding_put(finding)])


def record_repair(store: Store, finding: Finding, repair: Repair) -> None:
    """Log a repair outcome alone, as the repair's own transaction logs it."""
    assert store.outbox.enqueue([store.log.repair_put(finding, repair)])


def items(client: Any) -> list[dict[str, Any]]:
    return list(client.scan(TableName=TABLE, ConsistentRead=True)["Items"])


def test_a_finding_is_stored_once_under_its_parent(store: Store, client: Any) -> None:
    finding = drift(first_seen="2024-05-01T10:00:00.000Z")
    record(store, finding)
    record(store, finding)

    [item] = items(client)
    assert item["PK"] == {"S": 'PARENT#likes#{"PK":"POST#a91f","SK":"META"}'}
    assert item["SK"] == {"S": f"FINDING#{finding.finding_id}"}
    assert item["stored"] == {"N": "7"}
    assert item["key"] == {"M": {"PK": {"S": "POST#a91f"}, "SK": {"S": "META"}}}
    assert item["firstSeen"] == {"S": "2024-05-01T10:00:00.000Z"}
    assert item["repairStatus"] == {"S": "skipped"}
    assert item["expiresAt"] == {"N": str(1_700_000_000 + 90 * 86_400)}


def test_the_parent_key_is_canonical_whatever_the_key_order(store: Store) -> None:
    record(store, drift(key={"SK": "META", "PK": "POST#a91f"}))
    record(store, drift(key=KEY, detected_at="2030-01-01T00:00:00.000Z"))

    assert len(store.log.findings()) == 1


def test_findings_come_back_newest_first_with_parsed_bodies(store: Store) -> None:
    old = drift(7, 5, detected_at="2024-05-01T10:00:00.000Z")
    new = drift(9, 5, detected_at="2024-05-02T10:00:00.000Z")
    void = Repair("applied", "VOID tombstone written", None, "VOID")
    gap = drift(3, 5, kind="gap", number=4, detected_at="2024-05-03T10:00:00.000Z", repair=void)
    for finding in (old, gap, new):
        record(store, finding)
    record_repair(store, old, Repair("skipped", "rule is alert-only"))

    found = store.log.findings()
    assert [f["body"] for f in found] == [gap.body(), new.body(), old.body()]
    assert found[0]["repairStatus"] == "applied"
    assert found[0]["stored"] == Decimal(3)
    assert [f["body"] for f in store.log.findings("drift")] == [new.body(), old.body()]
    assert store.log.findings("orphans") == []


@contextmanager
def pages_of(client: Any, size: int, operation: str) -> Iterator[list[dict[str, Any]]]:
    """Every ``operation`` (Scan, Query) page holds at most ``size`` items, whether the
    code pages by hand or with a paginator; yields the requests as the code made them."""
    sent: list[dict[str, Any]] = []

    def small(params: dict[str, Any], **_: Any) -> None:
        sent.append(dict(params))
        params["Limit"] = size

    event = f"before-parameter-build.dynamodb.{operation}"
    client.meta.events.register(event, small)
    try:
        yield sent
    finally:
        client.meta.events.unregister(event, small)


def test_findings_and_repairs_follow_scan_pages(client: Any, clock: Clock) -> None:
    store = Store(client, TABLE, clock)
    for stored in range(6, 10):
        record(store, drift(stored, 5))
        record_repair(store, drift(stored, 5), Repair("skipped", "alert-only"))

    with pages_of(client, 1, "Scan") as sent:
        assert sorted(f["stored"] for f in store.log.findings()) == [6, 7, 8, 9]
        read = len(sent)
        assert len(store.log.repairs()) == 4
    assert read > 4 and len(sent) - read > 4  # a page per item of the table, at least
    assert all(request["ConsistentRead"] for request in sent)


def alert(store: Store, finding: Finding, remind: int = 0) -> bool:
    message = AlertMessage.of(finding, finding.alert_id(finding.detected_at))
    return store.outbox.enqueue(
        [store.standing.standing_put(finding, remind), store.outbox.outbox_put(message)]
    )


def test_a_standing_finding_is_alerted_once_until_it_changes(store: Store) -> None:
    skipped = Repair("skipped", "alert-only")
    assert alert(store, drift(7, 5, repair=skipped)) is True
    assert alert(store, drift(7, 5, repair=skipped)) is False  # redelivered
    assert alert(store, drift(8, 6, repair=skipped)) is False  # same offset: still standing
    assert alert(store, drift(9, 5, repair=skipped)) is True  # a new drift
    assert alert(store, drift(9, 5, repair=Repair("dry_run", "dry run"))) is True  # new outcome
    store.standing.clear_standing("likes", KEY)
    assert alert(store, drift(9, 5, repair=Repair("dry_run", "dry run"))) is True


def test_gaps_stand_one_per_number(store: Store) -> None:
    def gap(number: int) -> Finding:
        return drift(kind="gap", number=number)

    assert [alert(store, gap(n)) for n in (2, 3, 2)] == [True, True, False]


def test_a_reminder_period_alerts_a_standing_finding_again(store: Store, clock: Clock) -> None:
    assert alert(store, drift(), remind=3600) is True
    clock.now += 3600
    assert alert(store, drift(), remind=3600) is False  # due at this very second: not yet
    clock.now += 1
    assert alert(store, drift(), remind=3600) is True


def test_a_pending_alert_is_leased_to_one_publisher_at_a_time(store: Store, clock: Clock) -> None:
    message = AlertMessage("a1", "subject", "{}", {})
    assert store.outbox.enqueue([store.outbox.outbox_put(message)])
    assert store.outbox.pending_alerts() == []  # its writer holds the lease
    clock.now += LEASE_SECONDS + 1
    assert [a["SK"] for a in store.outbox.pending_alerts()] == ["a1"]
    assert store.outbox.lease_alert("a1") is True
    assert store.outbox.lease_alert("a1") is False
    store.outbox.release_alert("a1")
    assert store.outbox.lease_alert("a1") is True
    store.outbox.alert_sent("a1")
    clock.now += LEASE_SECONDS + 1
    assert store.outbox.pending_alerts() == []
    assert store.outbox.lease_alert("a1") is False


def test_pending_alerts_follow_query_pages_and_stop_once_the_limit_is_in_hand(
    store: Store, client: Any, clock: Clock
) -> None:
    for n in range(1, 6):
        assert store.outbox.enqueue([store.outbox.outbox_put(AlertMessage(f"a{n}", "s", "{}", {}))])
    clock.now += LEASE_SECONDS + 1
    with pages_of(client, 2, "Query") as sent:
        assert [a["SK"] for a in store.outbox.pending_alerts(3)] == ["a1", "a2", "a3"]
        assert len(sent) == 2  # the third page is never asked for
        assert [a["SK"] for a in store.outbox.pending_alerts()] == ["a1", "a2", "a3", "a4", "a5"]
    assert len(sent) >= 2 + 3
    assert all(request["ConsistentRead"] for request in sent)


def test_the_watermark_only_moves_forward(store: Store) -> None:
    key = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
    assert store.watermarks.watermark("issues", key) == 0

    assert store.watermarks.advance_watermark("issues", key, 5) is True
    assert store.watermarks.advance_watermark("issues", key, 3) is False
    assert store.watermarks.advance_watermark("issues", key, 5) is False
    assert store.watermarks.watermark("issues", {"SK": "COUNTER#ISSUE", "PK": "PROJECT#A"}) == 5
    assert store.watermarks.advance_watermark("issues", key, 8) is True

    assert store.watermarks.watermark("issues", key) == 8
    assert store.watermarks.watermark("issues", {"PK": "PROJECT#B", "SK": "COUNTER#ISSUE"}) == 0
    assert store.watermarks.watermark("other", key) == 0


def _set_counter(value: int) -> dict[str, Any]:
    return {
        "Update": {
            "TableName": TABLE,
            "Key": serialize({"PK": "COUNTER", "SK": "X"}),
            "UpdateExpression": "ADD hits :one",
            "ExpressionAttributeValues": serialize({":one": value}),
        }
    }


def test_a_repair_log_commits_with_its_repair_and_only_once(store: Store, client: Any) -> None:
    finding = drift()
    repair = Repair("applied", "counter set to the settled recount", Decimal(7), Decimal(5))
    log = store.log.repair_put(finding, repair)
    assert log["Put"]["ConditionExpression"] == "attribute_not_exists(PK)"

    client.transact_write_items(TransactItems=[_set_counter(1), log])
    with pytest.raises(ClientError) as cancelled:
        client.transact_write_items(TransactItems=[_set_counter(1), log])

    reasons = cancelled.value.response["CancellationReasons"]
    assert [r["Code"] for r in reasons] == ["None", "ConditionalCheckFailed"]
    counter = client.get_item(TableName=TABLE, Key=serialize({"PK": "COUNTER", "SK": "X"}))
    assert counter["Item"]["hits"] == {"N": "1"}
    [entry] = store.log.repairs()
    assert entry["SK"] == f"REPAIR#2023-11-14T22:13:20.000Z#{finding.finding_id}"
    assert entry["PK"] == 'PARENT#likes#{"PK":"POST#a91f","SK":"META"}'
    assert (entry["status"], entry["before"], entry["after"]) == ("applied", 7, 5)
    assert entry["findingId"] == finding.finding_id
    assert entry["expiresAt"] == 1_700_000_000 + 365 * 86_400


def test_repairs_without_a_table_write_are_logged_newest_first(store: Store, clock: Clock) -> None:
    record_repair(store, drift(), Repair("dry_run", "dry run", Decimal(7), Decimal(5)))
    clock.now += 1.5
    record_repair(store, drift(), Repair("disabled", "kill switch is on"))

    logged = store.log.repairs()
    assert [(r["status"], r["before"], r["after"]) for r in logged] == [
        ("disabled", None, None),
        ("dry_run", 7, 5),
    ]
    assert logged[0]["at"] == "2023-11-14T22:13:21.500Z"
    assert store.log.findings() == []


def test_a_marker_commits_once_and_confirms_one_record_on_its_key(
    store: Store, client: Any
) -> None:
    marker = store.log.marker_put("r:1", KEY, {"likeTally": Decimal("3.0")})
    client.transact_write_items(TransactItems=[_set_counter(-1), marker])
    with pytest.raises(ClientError):
        client.transact_write_items(TransactItems=[_set_counter(-1), marker])
    counter = client.get_item(TableName=TABLE, Key=serialize({"PK": "COUNTER", "SK": "X"}))
    assert counter["Item"]["hits"] == {"N": "-1"}

    shown = serialize({"likeTally": Decimal(3), "other": "x"})
    other_key = {"PK": "POST#b", "SK": "META"}
    assert store.log.confirm_marker("r:1", {"SK": "META", "PK": "POST#a91f"}, shown, "100") is True
    assert store.log.confirm_marker("r:1", KEY, shown, "100") is True  # the same record again
    assert store.log.confirm_marker("r:1", KEY, shown, "200") is False  # a second record: replayed
    assert store.log.confirm_marker("r:1", other_key, shown, "100") is False
    wrong = serialize({"likeTally": Decimal(53)})
    assert store.log.confirm_marker("r:1", KEY, wrong, "100") is False  # not what the repair wrote
    assert store.log.confirm_marker("forged", KEY, shown, "300") is False
    [logged] = [i for i in items(client) if i["PK"]["S"].startswith("MARKER#")]
    assert logged["expiresAt"]["N"] == str(1_700_000_000 + 2 * 86_400)


def test_a_carry_is_replaced_only_from_the_state_it_was_read_in(store: Store) -> None:
    """A fold read before a recheck took the remainder off (same ``through``) must not put
    it back: the fence covers the remainder and its window, not only ``through``."""
    empty = store.carries.carry("likes", {"PK": "POST#1", "SK": "META"})
    opened = Carry(Decimal(1), 10, 111)
    assert store.carries.put_carry("likes", {"PK": "POST#1", "SK": "META"}, empty, opened)
    read_by_fold = store.carries.carry("likes", {"PK": "POST#1", "SK": "META"})
    taken_off = Carry(Decimal(0), 10)  # the recheck recounted and kept ``through``
    assert store.carries.put_carry("likes", {"PK": "POST#1", "SK": "META"}, read_by_fold, taken_off)
    folded = Carry(Decimal(2), 12, 111)
    assert not store.carries.put_carry(
        "likes", {"PK": "POST#1", "SK": "META"}, read_by_fold, folded
    )
    assert store.carries.carry("likes", {"PK": "POST#1", "SK": "META"}).remainder == 0


def test_recent_index_children_are_read_back_within_their_window_only(client: Any) -> None:
    """The stream's window of children found through an index: a child noted under a parent
    is read back, as its latest record left it, for ``window`` seconds after it was noted,
    under that parent and rule only; an older record never replaces a newer one's note; TTL
    (which deletes late) is set to the same moment."""
    clock = Clock()
    store = Store(client, TABLE, clock)
    ann, bob = {"PK": "USER#ann", "SK": "PROFILE"}, {"PK": "USER#bob", "SK": "PROFILE"}
    dan, eve, fay = ({"PK": f"USER#{n}", "SK": "FOLLOWS#ann"} for n in ("dan", "eve", "fay"))
    start = clock.now
    store.recent.remember_children(
        "followers",
        ann,
        [Noted(dan, "900", True), Noted(eve, "7", True), Noted(dan, "1000", False)],
        900,
    )
    clock.now += 100
    store.recent.remember_children("followers", ann, [Noted(fay, "1200", None)], 900)

    def recent(rule: str = "followers", parent: dict[str, str] = ann) -> list[Noted]:
        return sorted(store.recent.recent_children(rule, parent, 900), key=lambda n: n.key["PK"])

    assert recent() == [Noted(dan, "1000", False), Noted(eve, "7", True), Noted(fay, "1200", None)]
    with pages_of(client, 1, "Query") as sent:
        assert recent() == [
            Noted(dan, "1000", False),
            Noted(eve, "7", True),
            Noted(fay, "1200", None),
        ]
    assert len(sent) >= 3 and all(request["ConsistentRead"] for request in sent)
    assert recent(parent=bob) == [] and recent(rule="likes") == []
    store.recent.remember_children(
        "followers", ann, [Noted(dan, "950", True)], 900
    )  # older: kept out
    assert recent()[0] == Noted(dan, "1000", False)
    clock.now = start + 950  # dan and eve were noted 950 s ago, fay 850 s ago
    assert recent() == [Noted(fay, "1200", None)]
    store.recent.remember_children("lines", ann, [Noted(dan, "1300", True, Decimal("2.50"))], 900)
    assert recent(rule="lines") == [Noted(dan, "1300", True, Decimal("2.50"))]
    # Noted at the record's stream time; one older than the window (a replay) is not noted,
    # one ahead of this clock is noted now.
    old, ahead = clock.now - 901, clock.now + 60
    store.recent.remember_children("old", ann, [Noted(dan, "1", True, None, old)], 900)
    store.recent.remember_children("ahead", ann, [Noted(dan, "1", True, None, ahead)], 900)
    store.recent.remember_children("then", ann, [Noted(dan, "1", True, None, clock.now - 100)], 900)
    assert recent(rule="old") == []
    assert [n.at for n in recent(rule="ahead")] == [int(clock.now)]
    assert [n.at for n in recent(rule="then")] == [int(clock.now) - 100]
    item = client.get_item(
        TableName=TABLE,
        Key=serialize(
            {
                "PK": 'PARENT#lines#{"PK":"USER#ann","SK":"PROFILE"}',
                "SK": 'RECENT#{"PK":"USER#dan","SK":"FOLLOWS#ann"}',
            }
        ),
    )["Item"]
    assert (int(item["at"]["N"]), int(item["expiresAt"]["N"])) == (
        int(clock.now),
        int(clock.now) + 900,
    )
