"""The verification protocol against moto: fast path, settled recount, fenced repair, gaps."""

from __future__ import annotations

import itertools
import json
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws

from tally.core.dynamodb import deserialize, serialize
from tally.local.template import create_table, load_template, template_path
from tally.reconciler.checks.counts import SMALL_PARENT
from tally.reconciler.findings import Finding
from tally.reconciler.repair.policy import RepairPolicy
from tally.reconciler.report.alerts import AlertPublisher
from tally.reconciler.report.rechecks import Recheck, RecheckQueue, parse_recheck
from tally.reconciler.report.scheduling import Settle
from tally.reconciler.store.carries import Carries
from tally.reconciler.store.parts import Store
from tally.reconciler.table.tally_table import TallyTable
from tally.reconciler.verification import Reconciler
from tally.rules import RuleSet, load_rules, parse_rules
from tests.utils import stream_record

RULES_FILE = Path(__file__).parents[2] / "integration" / "rules.toml"
RULES = load_rules(RULES_FILE)
MAIN, AUDIT = "main", "audit"
POST = {"PK": "POST#a91f", "SK": "META"}
PROJECT = {"PK": "PROJECT#p1", "SK": "COUNTER#ISSUE"}
USERS = {"PK": "UserMetadata", "SK": "META"}
TTL = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}


def bumped(
    keys: dict[str, str], attribute: str, before: Any, after: Any, **kw: Any
) -> dict[str, Any]:
    """A MODIFY that moved one counter (and nothing else) on the parent."""
    return stream_record("MODIFY", keys, {attribute: after}, {attribute: before}, **kw)


def like_insert(post: str, user: str, seq: str | None = None) -> dict[str, Any]:
    return stream_record("INSERT", {"PK": post, "SK": f"LIKE#USER#{user}"}, {}, seq=seq)


@dataclass
class Rig:
    """Two tables, an alert topic with a subscribed queue, and a recheck queue, in moto."""

    ddb: Any
    sqs: Any
    sns: Any
    topic_arn: str
    alert_queue: str
    recheck_queue: str

    def reconciler(
        self,
        policy: RepairPolicy | None = None,
        rules: RuleSet = RULES,
        carrying: bool = True,
        rechecks: RecheckQueue | None = None,
    ) -> Reconciler:
        store = Store(self.ddb, AUDIT)
        return Reconciler(
            rules,
            TallyTable(self.ddb, MAIN, rules),
            store,
            AlertPublisher(self.sns, self.topic_arn, store.outbox),
            rechecks or RecheckQueue(self.sqs, self.recheck_queue),
            policy or RepairPolicy(),
            Settle(attempts=4, pause_seconds=0),
            carry_seconds=0,  # moto would hide a delayed recheck from ``run_rechecks``
            carrying=carrying,
        )

    @property
    def store(self) -> Store:
        return Store(self.ddb, AUDIT)

    def put(self, item: dict[str, Any]) -> None:
        self.ddb.put_item(TableName=MAIN, Item=serialize(item))

    def item(self, key: dict[str, str]) -> dict[str, Any] | None:
        response = self.ddb.get_item(TableName=MAIN, Key=serialize(key), ConsistentRead=True)
        return deserialize(response["Item"]) if "Item" in response else None

    def value(self, key: dict[str, str], attribute: str) -> Any:
        item = self.item(key)
        assert item is not None, key
        return item.get(attribute)

    def likes(self, post: str, count: int, tally: int, revision: int = 1) -> None:
        """A post with ``count`` likes and a stored ``tally``."""
        self.put({"PK": post, "SK": "META", "likeTally": tally, "tallyRevision": revision})
        for user in range(count):
            self.put({"PK": post, "SK": f"LIKE#USER#{user}"})

    def issues(self, project: dict[str, str], last: int, numbers: list[int]) -> None:
        self.put({**project, "lastIssue": last})
        for number in numbers:
            self.put({"PK": project["PK"], "SK": f"ISSUE#{number:010d}", "title": "t"})

    def _drain(self, queue: str) -> list[dict[str, Any]]:
        bodies: list[dict[str, Any]] = []
        while messages := self.sqs.receive_message(
            QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=0
        ).get("Messages", []):
            for message in messages:
                bodies.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
        return bodies

    def alerts(self) -> list[dict[str, Any]]:
        """The alert bodies SNS delivered to the subscribed queue."""
        return [json.loads(envelope["Message"]) for envelope in self._drain(self.alert_queue)]

    def rechecks(self) -> list[dict[str, Any]]:
        return self._drain(self.recheck_queue)

    def run_rechecks(self, checker: Reconciler) -> int:
        """Hand every due recheck to ``checker``, as the recheck handler would."""
        bodies = self.rechecks()
        for body in bodies:
            checker.recheck(parse_recheck(json.dumps(body)))
        return len(bodies)


@pytest.fixture
def rig() -> Iterator[Rig]:
    with mock_aws():
        yield make_rig()


def make_rig() -> Rig:
    """The rig's resources, inside an active ``mock_aws``."""
    ddb, sqs, sns = boto3.client("dynamodb"), boto3.client("sqs"), boto3.client("sns")
    template = load_template(template_path())
    create_table(ddb, template, "Table", MAIN)
    create_table(ddb, template, "AuditTable", AUDIT)
    topic_arn = sns.create_topic(Name="tally-alerts")["TopicArn"]
    alert_queue = sqs.create_queue(QueueName="alerts")["QueueUrl"]
    alert_arn = sqs.get_queue_attributes(QueueUrl=alert_queue, AttributeNames=["QueueArn"])
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=alert_arn["Attributes"]["QueueArn"])
    recheck_queue = sqs.create_queue(QueueName="rechecks")["QueueUrl"]

    return Rig(ddb, sqs, sns, topic_arn, alert_queue, recheck_queue)


def status(finding: Finding) -> str:
    assert finding.repair is not None
    return finding.repair.status


# --- step 1: the fast path --------------------------------------------------------------


def test_a_balanced_batch_makes_no_read_and_no_finding(rig: Rig) -> None:
    rig.likes("POST#a91f", count=1, tally=1)
    checker = rig.reconciler()
    failed = checker.verify_batch([like_insert("POST#a91f", "0"), bumped(POST, "likeTally", 0, 1)])
    assert failed == []
    assert (checker.table.reads.items, checker.table.reads.recounts) == (0, 0)
    assert checker.stats.balanced == 1
    assert checker.log == [] and rig.alerts() == [] and rig.store.log.findings() == []


# --- step 1b: the carry -----------------------------------------------------------------

HOT = SMALL_PARENT + 20  # likes on a hot post: above SMALL_PARENT, so its remainders are carried


def hot_likes(first: int, count: int) -> list[dict[str, Any]]:
    """``count`` like transactions on a hot post, each as its child and its counter record."""
    records = []
    for n in range(first, first + count):
        records.append(like_insert("POST#a91f", f"new{n}"))
        records.append(bumped(POST, "likeTally", HOT + n, HOT + n + 1))
    return records


def test_a_split_transaction_on_a_hot_parent_is_carried_not_recounted(rig: Rig) -> None:
    rig.likes("POST#a91f", count=0, tally=HOT)
    records = hot_likes(0, 3)
    checker = rig.reconciler()
    for batch in (records[:1], records[1:]):  # the boundary splits the first like
        assert checker.verify_batch(batch) == []
    assert checker.table.reads.recounts == 0
    assert checker.table.reads.items == 1  # a child-only half reads the counter, to size it
    assert rig.store.carries.carry("likes", POST).remainder == 0
    assert checker.stats.carried == 1 and checker.log == []
    [recheck] = rig.rechecks()  # the open remainder's window; it finds nothing to do
    checker.recheck(parse_recheck(json.dumps(recheck)))
    assert checker.table.reads.recounts == 0


def test_steady_traffic_split_at_every_boundary_is_never_recounted(rig: Rig) -> None:
    """Each batch ends mid-transaction and is balanced (it begins with the other half of the
    previous one's last): an open remainder is still folded, so it is cancelled in time."""
    rig.likes("POST#a91f", count=HOT, tally=HOT)
    records = hot_likes(0, 3)
    checker = rig.reconciler()
    checker.verify_batch(records[:1])
    [opened] = rig.rechecks()
    checker.verify_batch(records[1:3])  # balanced, and still the remainder's cancellation
    carry = rig.store.carries.carry("likes", POST)
    assert carry.remainder == -1 and carry.since != opened["carry_since"]
    checker.recheck(parse_recheck(json.dumps(opened)))  # its window passed: nothing to do
    for batch in (records[3:5], records[5:]):
        checker.verify_batch(batch)
    rig.run_rechecks(checker)
    assert checker.table.reads.recounts == 0 and checker.log == []
    assert rig.store.carries.carry("likes", POST).remainder == 0


def test_a_balanced_batch_with_no_open_carry_reads_nothing(rig: Rig) -> None:
    rig.likes("POST#a91f", count=HOT, tally=HOT)
    records = hot_likes(0, 2)
    checker = rig.reconciler()
    for batch in (records[:1], records[1:3], records[3:]):  # the carry closes with the last
        checker.verify_batch(batch)
    units = checker.store.carries.carry_units
    checker.verify_batch(hot_likes(2, 1))
    assert checker.store.carries.carry_units == units and checker.table.reads.items == 1


def test_redelivered_and_bisected_batches_never_add_a_record_twice(rig: Rig) -> None:
    rig.likes("POST#a91f", count=0, tally=HOT)
    records = hot_likes(0, 4)
    checker = rig.reconciler()
    checker.verify_batch(records[:3])
    checker.verify_batch(records[3:])
    for again in (records[:3], records[3:], records[:1], records[1:3], records[5:], records):
        assert checker.verify_batch(again) == []
    carry = rig.store.carries.carry("likes", POST)
    assert (carry.remainder, carry.through) == (0, int(records[-1]["dynamodb"]["SequenceNumber"]))
    assert checker.table.reads.recounts == 0 and checker.log == []


def test_a_rogue_write_on_a_hot_parent_is_recounted_after_the_window(rig: Rig) -> None:
    rig.likes("POST#a91f", count=HOT, tally=HOT + 40)  # the rogue write the record shows
    checker = rig.reconciler()
    checker.verify_batch([bumped(POST, "likeTally", HOT, HOT + 40)])
    assert checker.log == [] and checker.table.reads.recounts == 0
    assert rig.store.carries.carry("likes", POST).remainder == 40
    assert rig.run_rechecks(checker) == 1
    [finding] = checker.log
    assert (finding.kind, finding.stored, finding.actual) == ("drift", HOT + 40, HOT)
    assert status(finding) == "applied" and rig.value(POST, "likeTally") == HOT
    carry = rig.store.carries.carry("likes", POST)
    assert (carry.remainder, carry.since) == (0, 0)  # what the recount covered is taken off


def test_a_carry_recheck_that_overtakes_its_carrys_write_comes_back(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recheck is sent before the carry is written; one delivered while that write is
    still under way (throttled, retried) finds no carry yet, and must not be the last."""
    rig.likes("POST#a91f", count=HOT, tally=HOT + 40)  # the rogue write the record shows
    checker = rig.reconciler()
    put_carry = Carries.put_carry
    overtaken: list[int] = []

    def slow_put(carries: Carries, *args: Any, **kwargs: Any) -> bool:
        if not overtaken:
            overtaken.append(rig.run_rechecks(checker))  # delivered before the write lands
        return put_carry(carries, *args, **kwargs)

    monkeypatch.setattr(Carries, "put_carry", slow_put)
    checker.verify_batch([bumped(POST, "likeTally", HOT, HOT + 40)])
    assert overtaken == [1] and checker.log == [] and checker.table.reads.recounts == 0
    monkeypatch.undo()
    assert rig.store.carries.carry("likes", POST).remainder == 40
    assert rig.run_rechecks(checker) == 1  # it came back, and recounts now
    [finding] = checker.log
    assert (finding.kind, finding.stored, finding.actual) == ("drift", HOT + 40, HOT)
    assert rig.run_rechecks(checker) == 0


def test_a_carry_recheck_for_a_remainder_cancelled_meanwhile_does_not_come_back(rig: Rig) -> None:
    rig.likes("POST#a91f", count=HOT, tally=HOT + 1)
    checker = rig.reconciler()
    checker.verify_batch([bumped(POST, "likeTally", HOT, HOT + 1, seq="10")])
    checker.verify_batch([like_insert("POST#a91f", "late", seq="11")])  # the other half
    assert rig.store.carries.carry("likes", POST).remainder == 0
    assert rig.run_rechecks(checker) == 1
    assert rig.rechecks() == [] and checker.table.reads.recounts == 0


def test_a_replay_recounts_records_the_carry_has_already_passed(rig: Rig) -> None:
    """A failed batch replayed after later batches carried past it is recounted, not taken
    for folded before: the drift it holds is found."""
    rig.likes("POST#a91f", count=HOT, tally=HOT + 40)
    failed = [bumped(POST, "likeTally", HOT, HOT + 40)]
    later = hot_likes(100, 2)
    checker = rig.reconciler()
    checker.verify_batch(later[:1])  # a later batch carries, past the failed one's records
    replaying = rig.reconciler(carrying=False)
    assert replaying.verify_batch(failed) == []
    [finding] = replaying.log
    assert (finding.kind, finding.stored, finding.actual) == ("drift", HOT + 40, HOT)


def test_records_folded_during_the_recheck_keep_their_own_window(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.likes("POST#a91f", count=HOT, tally=HOT + 40)
    checker = rig.reconciler()
    checker.verify_batch([bumped(POST, "likeTally", HOT, HOT + 40)])
    [recheck] = rig.rechecks()
    recount = checker.table.parents.tally_children

    def meanwhile(rule: Any, key: dict[str, str]) -> Any:
        # Half of a like lands in the carry while the recount runs.
        rig.reconciler().verify_batch([like_insert("POST#a91f", "late")])
        return recount(rule, key)

    monkeypatch.setattr(checker.table.parents, "tally_children", meanwhile)
    checker.recheck(parse_recheck(json.dumps(recheck)))
    carry = rig.store.carries.carry("likes", POST)
    assert carry.remainder == -1 and carry.since > 0
    [follow_up] = rig.rechecks()
    assert follow_up["carry_since"] == carry.since


def test_a_small_parent_is_recounted_at_once_reusing_its_first_read(rig: Rig) -> None:
    rig.likes("POST#a91f", count=1, tally=1)
    checker = rig.reconciler()
    assert checker.verify_batch([like_insert("POST#a91f", "0")]) == []
    assert checker.table.reads.recounts == 1
    assert checker.table.reads.items == 3  # parent, the one child, parent again
    assert rig.store.carries.carry("likes", POST).through == -1  # no carry for a small parent
    assert rig.rechecks() == []


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.integers(1, 11), max_size=4),
    replays=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=3),
)
def test_any_batching_with_any_redelivery_balances_out(
    cuts: list[int], replays: list[tuple[int, int]]
) -> None:
    """Balanced transactions cut anywhere read no child; any slice delivered again later
    (redelivery, bisection, a retry from a failed record) raises nothing, and once the
    windows pass the carry is zero again."""
    with mock_aws():
        rig = make_rig()
        rig.likes("POST#a91f", count=SMALL_PARENT + 1, tally=SMALL_PARENT + 1)  # consistent
        records = hot_likes(0, 6)
        bounds = [0, *sorted(set(cuts)), len(records)]
        checker = rig.reconciler()
        for low, high in itertools.pairwise(bounds):
            checker.verify_batch(records[low:high])
        assert checker.table.reads.recounts == 0
        assert rig.store.carries.carry("likes", POST).remainder == 0
        for low, high in replays:
            checker.verify_batch(records[low:high])
        # A slice of a batch that balanced without a carry is one remainder: recounted once.
        rig.run_rechecks(checker)
        assert rig.store.carries.carry("likes", POST).remainder == 0
        assert checker.log == []


# --- step 2: the settled recount --------------------------------------------------------


def test_an_unbalanced_group_on_a_consistent_table_is_recounted_once(rig: Rig) -> None:
    rig.likes("POST#a91f", count=1, tally=1)
    checker = rig.reconciler()
    assert checker.verify_batch([like_insert("POST#a91f", "0")]) == []
    assert checker.table.reads.recounts == 1
    assert checker.stats.consistent == 1
    assert checker.log == [] and rig.alerts() == []


def test_drift_is_found_repaired_logged_and_alerted_once(rig: Rig) -> None:
    rig.likes("POST#a91f", count=2, tally=5, revision=3)
    checker = rig.reconciler()
    assert checker.verify_batch([bumped(POST, "likeTally", 4, 5)]) == []
    [finding] = checker.log
    assert (finding.kind, finding.stored, finding.actual) == ("drift", 5, 2)
    assert status(finding) == "applied"
    parent = rig.item(POST)
    assert parent is not None
    assert (parent["likeTally"], parent["tallyRevision"]) == (2, 4)
    marker = parent["tallyRepair"]
    image = serialize({"likeTally": Decimal(2)})
    assert rig.store.log.confirm_marker(marker, POST, image, "1")  # the audit table logged it
    [logged] = rig.store.log.repairs()
    assert (logged["before"], logged["after"], logged["status"]) == (5, 2, "applied")
    [alert] = rig.alerts()
    assert (alert["kind"], alert["stored"], alert["actual"]) == ("drift", 5, 2)
    assert alert["repair"]["status"] == "applied"
    assert [f["SK"] for f in rig.store.log.findings()] == [f"FINDING#{finding.finding_id}"]


def test_a_redelivered_drift_batch_does_not_alert_twice(rig: Rig) -> None:
    rig.likes("POST#a91f", count=2, tally=5)
    batch = [bumped(POST, "likeTally", 4, 5)]
    rig.reconciler(RepairPolicy(dry_run=True)).verify_batch(batch)
    rig.reconciler(RepairPolicy(dry_run=True)).verify_batch(batch)
    assert len(rig.alerts()) == 1


def test_a_no_revision_rule_calls_drift_only_on_two_agreeing_reads(rig: Rig) -> None:
    team = {"PK": "TEAM#1", "SK": "META"}
    rig.put({**team, "memberCount": 5})
    rig.put({"PK": "TEAM#1", "SK": "MEMBER#ann"})
    checker = rig.reconciler()
    checker.verify_batch([stream_record("INSERT", {"PK": "TEAM#1", "SK": "MEMBER#ann"}, {})])
    [finding] = checker.log
    assert (finding.kind, finding.stored, finding.actual) == ("drift", 5, 1)
    assert "two agreeing settled reads" in finding.detail
    assert checker.table.reads.recounts == 2
    assert rig.value(team, "memberCount") == 1


def test_a_parent_that_never_holds_still_is_deferred_not_judged(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.likes("POST#a91f", count=2, tally=5)
    checker = rig.reconciler()
    original = checker.table.parents.tally_children

    def busy(rule: Any, key: dict[str, str]) -> Any:
        rig.ddb.update_item(
            TableName=MAIN,
            Key=serialize(key),
            UpdateExpression="ADD tallyRevision :one",
            ExpressionAttributeValues=serialize({":one": 1}),
        )
        return original(rule, key)

    monkeypatch.setattr(checker.table.parents, "tally_children", busy)
    assert checker.verify_batch([bumped(POST, "likeTally", 4, 5)]) == []
    assert checker.log == [] and checker.stats.deferred == 1
    assert rig.rechecks() == []  # not hammered: the recheck waits out its delay
    attributes = rig.sqs.get_queue_attributes(
        QueueUrl=rig.recheck_queue, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"
    assert rig.value(POST, "likeTally") == 5


# --- step 3: repair ---------------------------------------------------------------------


def test_a_fenced_repair_never_writes_a_stale_count(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.likes("POST#a91f", count=2, tally=5)
    checker = rig.reconciler()
    original = checker.table.writes.set_counter
    outcomes: list[bool] = []

    def racing(rule: Any, key: dict[str, str], *args: Any) -> bool:
        if not outcomes:
            # A late like lands between verification and repair: the revision moves,
            # the counter does not (the A->B->A case only the revision can catch).
            rig.put({"PK": "POST#a91f", "SK": "LIKE#USER#late"})
            rig.ddb.update_item(
                TableName=MAIN,
                Key=serialize(key),
                UpdateExpression="ADD tallyRevision :one",
                ExpressionAttributeValues=serialize({":one": 1}),
            )
        outcomes.append(original(rule, key, *args))
        return outcomes[-1]

    monkeypatch.setattr(checker.table.writes, "set_counter", racing)
    checker.verify_batch([bumped(POST, "likeTally", 4, 5)])
    assert outcomes == [False, True]
    assert rig.value(POST, "likeTally") == 3
    [finding] = checker.log
    assert (finding.actual, status(finding)) == (3, "applied")
    assert [r["after"] for r in rig.store.log.repairs()] == [3]


def test_the_repair_budget_stops_the_second_repair(rig: Rig) -> None:
    rig.likes("POST#a", count=1, tally=4)
    rig.likes("POST#b", count=1, tally=4)
    checker = rig.reconciler(RepairPolicy(budget=1))
    batch = [bumped({"PK": p, "SK": "META"}, "likeTally", 3, 4) for p in ("POST#a", "POST#b")]
    checker.verify_batch(batch)
    outcomes = sorted((f.repair.status, f.repair.reason) for f in checker.log if f.repair)
    [(applied, _), (skipped, reason)] = outcomes
    assert (applied, skipped) == ("applied", "skipped")
    assert "budget" in reason
    tallies = sorted(rig.value({"PK": p, "SK": "META"}, "likeTally") for p in ("POST#a", "POST#b"))
    assert tallies == [1, 4]


def test_an_alert_mode_rule_is_reported_not_repaired(rig: Rig) -> None:
    order = {"PK": "ORDER#17", "SK": "META"}
    rig.put({**order, "total": Decimal(10), "tallyRevision": 1})
    rig.put({"PK": "ORDER#17", "SK": "LINE#1", "amount": Decimal("0.1")})
    rig.put({"PK": "ORDER#17", "SK": "LINE#2", "amount": Decimal("0.2")})
    checker = rig.reconciler()
    checker.verify_batch([bumped(order, "total", Decimal("0.3"), Decimal(10))])
    # Two lines: a small order is recounted by the batch itself, not carried first.
    assert rig.run_rechecks(checker) == 0
    [finding] = checker.log
    assert finding.actual == Decimal("0.3")
    assert finding.repair is not None and finding.repair.status == "skipped"
    assert "'alert'" in finding.repair.reason
    assert rig.value(order, "total") == 10


def test_the_kill_switch_reports_disabled_and_writes_nothing(rig: Rig) -> None:
    rig.likes("POST#a91f", count=2, tally=5)
    checker = rig.reconciler(RepairPolicy(enabled=False))
    checker.verify_batch([bumped(POST, "likeTally", 4, 5)])
    [finding] = checker.log
    assert status(finding) == "disabled"
    assert rig.value(POST, "likeTally") == 5
    assert rig.store.log.repairs() == []


def test_a_dry_run_reports_before_and_after_and_writes_nothing(rig: Rig) -> None:
    rig.likes("POST#a91f", count=2, tally=5)
    checker = rig.reconciler(RepairPolicy(dry_run=True))
    checker.verify_batch([bumped(POST, "likeTally", 4, 5)])
    [finding] = checker.log
    repair = finding.repair
    assert repair is not None
    assert (repair.status, repair.before, repair.after) == ("dry_run", 5, 2)
    assert rig.value(POST, "likeTally") == 5
    [alert] = rig.alerts()
    assert (alert["repair"]["before"], alert["repair"]["after"]) == (5, 2)


def test_a_rule_switched_off_is_not_checked_at_all(rig: Rig) -> None:
    raw = tomllib.loads(RULES_FILE.read_text())
    for rule in raw["rules"]:
        if rule["name"] == "likes":
            rule["repair"] = "off"
    rig.likes("POST#a91f", count=2, tally=5)
    checker = rig.reconciler(rules=parse_rules(raw))
    assert checker.verify_batch([bumped(POST, "likeTally", 4, 5)]) == []
    assert checker.log == [] and checker.table.reads.recounts == 0
    assert rig.alerts() == [] and rig.store.log.findings() == []
    assert rig.value(POST, "likeTally") == 5


# --- TTL --------------------------------------------------------------------------------


def test_a_ttl_expiry_on_a_decrement_rule_is_applied_exactly_once(rig: Rig) -> None:
    user = {"PK": "USER#u1", "SK": "META"}
    rig.put({**user, "activeSessions": 2, "tallyRevision": 1})
    rig.put({"PK": "USER#u1", "SK": "SESSION#live"})
    expired = stream_record("REMOVE", {"PK": "USER#u1", "SK": "SESSION#old"}, old={}, identity=TTL)
    rig.reconciler().verify_batch([expired])
    rig.reconciler().verify_batch([expired])  # a redelivery
    assert rig.value(user, "activeSessions") == 1
    assert rig.alerts() == []


def test_a_ttl_expiry_in_dry_run_counts_as_a_removal(rig: Rig) -> None:
    user = {"PK": "USER#u1", "SK": "META"}
    rig.put({**user, "activeSessions": 3, "tallyRevision": 2})
    rig.put({"PK": "USER#u1", "SK": "SESSION#live"})
    expired = stream_record("REMOVE", {"PK": "USER#u1", "SK": "SESSION#old"}, old={}, identity=TTL)
    rogue = bumped(user, "activeSessions", 2, 3)  # a counter bump without a session
    checker = rig.reconciler(RepairPolicy(dry_run=True))
    checker.verify_batch([expired, rogue])
    [finding] = checker.log
    assert (finding.kind, finding.stored, finding.actual) == ("ttl_removal", 3, 1)


def _throttled(operation: str) -> ClientError:
    error = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}}
    return ClientError(error, operation)  # type: ignore[arg-type]


def test_what_a_group_did_before_the_table_failed_it_is_counted(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TTL decrement applied before the recount was throttled stays counted: its retry
    finds it applied already and counts nothing."""
    user = {"PK": "USER#u1", "SK": "META"}
    rig.put({**user, "activeSessions": 2, "tallyRevision": 1})
    rig.put({"PK": "USER#u1", "SK": "SESSION#live"})
    expired = stream_record("REMOVE", {"PK": "USER#u1", "SK": "SESSION#old"}, old={}, identity=TTL)
    rogue = bumped(user, "activeSessions", 1, 2, seq="900")  # the group needs a recount
    checker = rig.reconciler()

    def throttled(rule: Any, key: dict[str, str]) -> Any:
        raise _throttled("Query")

    monkeypatch.setattr(checker.table.parents, "tally_children", throttled)
    assert checker.verify_batch([expired, rogue]) != []
    assert rig.value(user, "activeSessions") == 1  # the decrement was applied
    assert checker.stats.ttl_decrements == 1
    assert checker.stats.errors and "ProvisionedThroughputExceeded" in checker.stats.errors[0]


@pytest.mark.parametrize("path", ["stream", "recheck"])
def test_a_parent_checked_before_its_repair_failed_is_counted_checked(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    rig.likes("POST#a91f", count=3, tally=5)
    checker = rig.reconciler()

    def throttled(*args: Any, **kwargs: Any) -> Any:
        raise _throttled("TransactWriteItems")

    monkeypatch.setattr(checker.table.writes, "set_counter", throttled)
    if path == "stream":
        assert checker.verify_batch([bumped(POST, "likeTally", 4, 5)]) != []
    else:
        recheck = Recheck("likes", POST, 0, "a test")
        with pytest.raises(ClientError):
            checker.recheck(recheck)
    assert (checker.stats.checked, checker.stats.consistent) == (1, 0)
    assert rig.value(POST, "likeTally") == 5


def test_a_sequence_checked_before_its_repair_failed_is_counted_checked(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.issues(PROJECT, last=3, numbers=[1, 2, 3, 4, 5])  # the counter is behind its members
    checker = rig.reconciler()

    def throttled(*args: Any, **kwargs: Any) -> Any:
        raise _throttled("TransactWriteItems")

    monkeypatch.setattr(checker.table.writes, "set_counter", throttled)
    with pytest.raises(ClientError):
        checker.recheck(Recheck("issue-numbers", PROJECT, 5, "a test"))
    assert (checker.stats.checked, checker.stats.consistent) == (1, 0)
    assert rig.value(PROJECT, "lastIssue") == 3


# --- step 4: gaps -----------------------------------------------------------------------


def test_an_unbalanced_sequence_schedules_a_recheck_not_a_gap(rig: Rig) -> None:
    checker = rig.reconciler()
    checker.verify_batch(
        [
            bumped(PROJECT, "lastIssue", 3, 5),
            stream_record("INSERT", {"PK": "PROJECT#p1", "SK": "ISSUE#0000000004"}, {}),
        ]
    )
    [recheck] = rig.rechecks()
    assert (recheck["rule"], recheck["key"], recheck["counter_seen"]) == (
        "issue-numbers",
        PROJECT,
        5,
    )
    assert checker.log == [] and checker.table.reads.items == 0


def test_a_recheck_voids_a_missing_number_and_advances_the_watermark(rig: Rig) -> None:
    rig.issues(PROJECT, last=4, numbers=[1, 2, 4])
    checker = rig.reconciler()
    checker.recheck(Recheck("issue-numbers", PROJECT, 4, "unbalanced"))
    [gap] = checker.log
    assert (gap.kind, gap.number) == ("gap", 3)
    assert status(gap) == "applied"
    tombstone = rig.item({"PK": "PROJECT#p1", "SK": "ISSUE#0000000003"})
    assert tombstone is not None and tombstone["void"] is True
    assert rig.store.watermarks.watermark("issue-numbers", PROJECT) == 4


def test_a_recheck_judges_nothing_beyond_the_counter_it_saw(rig: Rig) -> None:
    rig.issues(PROJECT, last=4, numbers=[1, 2, 4])
    checker = rig.reconciler()
    checker.recheck(Recheck("issue-numbers", PROJECT, 2, "unbalanced"))
    assert checker.log == []
    assert rig.item({"PK": "PROJECT#p1", "SK": "ISSUE#0000000003"}) is None
    assert rig.store.watermarks.watermark("issue-numbers", PROJECT) == 2


def test_a_counter_behind_its_members_is_raised(rig: Rig) -> None:
    rig.issues(PROJECT, last=1, numbers=[1, 2, 3])
    checker = rig.reconciler()
    checker.recheck(Recheck("issue-numbers", PROJECT, 0, "unbalanced"))
    [finding] = checker.log
    assert (finding.kind, finding.stored, finding.actual) == ("counter_behind", 1, 3)
    assert status(finding) == "applied"
    assert rig.value(PROJECT, "lastIssue") == 3


def test_an_index_sequence_gap_gets_a_void_member_in_the_index(rig: Rig) -> None:
    rig.put({**USERS, "LastID": 3})
    for name, number in (("ann", 1), ("cy", 3)):
        rig.put(
            {
                "PK": f"User#{name}",
                "SK": "PROFILE",
                "seqName": "user-numbers",
                "NumIdentifier": number,
            }
        )
    checker = rig.reconciler()
    checker.recheck(Recheck("user-numbers", USERS, 3, "unbalanced"))
    [gap] = checker.log
    assert (gap.kind, gap.number) == ("gap", 2)
    assert [
        n for n, _ in checker.table.members.member_numbers(RULES["user-numbers"], USERS, 0)
    ] == [
        1,
        2,
        3,
    ]
    assert rig.store.watermarks.watermark("user-numbers", USERS) == 3


# --- failures ---------------------------------------------------------------------------


def test_a_group_that_cannot_be_read_fails_alone(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    rig.likes("POST#bad", count=1, tally=4)
    rig.likes("POST#good", count=1, tally=4)
    checker = rig.reconciler()
    original = checker.table.parents.tally_children

    def flaky(rule: Any, key: dict[str, str]) -> Any:
        if key["PK"] == "POST#bad":
            error = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "x"}}
            raise ClientError(error, "Query")
        return original(rule, key)

    monkeypatch.setattr(checker.table.parents, "tally_children", flaky)
    bad = {"PK": "POST#bad", "SK": "META"}
    batch = [
        bumped(bad, "likeTally", 3, 4, seq="5000"),
        bumped({"PK": "POST#good", "SK": "META"}, "likeTally", 3, 4, seq="4000"),
        bumped(bad, "likeTally", 4, 5, seq="700"),
    ]
    assert checker.verify_batch(batch) == ["700"]
    [finding] = checker.log
    assert finding.key == {"PK": "POST#good", "SK": "META"}
    assert rig.value({"PK": "POST#good", "SK": "META"}, "likeTally") == 1
    assert rig.value(bad, "likeTally") == 4
