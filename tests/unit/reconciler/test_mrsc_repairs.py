"""Repairs on a strongly consistent Global Table (MRSC), which refuses any transaction that
touches it: the marker's record, then the counter's fenced write alone, then the audit items
in a transaction of the audit table's own; a single-Region table keeps its one transaction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from tally.reconciler.protocol.regions import GlobalMode
from tally.reconciler.repair.policy import RepairPolicy
from tally.reconciler.repair.repairer import NO_TRANSACTION
from tally.reconciler.report.alerts import AlertPublisher
from tally.reconciler.report.rechecks import Recheck, RecheckQueue
from tally.reconciler.report.scheduling import Settle
from tally.reconciler.store.parts import Store
from tally.reconciler.table.tally_table import TallyTable
from tally.reconciler.verification import Reconciler
from tests.unit.reconciler.test_verification import (
    AUDIT,
    MAIN,
    POST,
    PROJECT,
    RULES,
    Rig,
    bumped,
    make_rig,
    status,
)

US, EU, AP = "us-east-1", "eu-west-1", "ap-southeast-2"
STRONG = GlobalMode(US, (US, EU, AP), US, 60, strong=True)


@pytest.fixture
def rig() -> Iterator[Rig]:
    with mock_aws():
        yield make_rig()


def calls(rig: Rig) -> list[tuple[str, list[str]]]:
    """Every write the rig's client makes from now on: its operation and the tables it names,
    in order."""
    seen: list[tuple[str, list[str]]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in ("PutItem", "UpdateItem", "DeleteItem"):
            seen.append((model.name, [params["TableName"]]))
        elif model.name == "TransactWriteItems":
            names = [d["TableName"] for i in params["TransactItems"] for d in i.values()]
            seen.append((model.name, names))

    rig.ddb.meta.events.register("before-parameter-build.dynamodb", record)
    return seen


def reconciler(rig: Rig, regions: GlobalMode | None) -> Reconciler:
    store = Store(rig.ddb, AUDIT)
    return Reconciler(
        RULES,  # not settled: the fast path repairs at once, which is the write under test
        TallyTable(rig.ddb, MAIN, RULES),
        store,
        AlertPublisher(rig.sns, rig.topic_arn, store.outbox),
        RecheckQueue(rig.sqs, rig.recheck_queue),
        RepairPolicy(),
        Settle(attempts=4, pause_seconds=0),
        carry_seconds=0,
        regions=regions,
    )


def test_a_single_region_repair_is_one_transaction_on_both_tables(rig: Rig) -> None:
    rig.likes("POST#a91f", count=2, tally=5, revision=3)
    seen = calls(rig)
    reconciler(rig, None).verify_batch([bumped(POST, "likeTally", 4, 5)])
    repairs = [(op, tables) for op, tables in seen if MAIN in tables]
    assert repairs == [("TransactWriteItems", [MAIN, AUDIT, AUDIT, AUDIT, AUDIT, AUDIT])]
    assert rig.value(POST, "likeTally") == 2


def test_on_mrsc_the_marker_goes_first_then_the_counter_alone_then_the_audit_items(
    rig: Rig,
) -> None:
    rig.likes("POST#a91f", count=2, tally=5, revision=3)
    seen = calls(rig)
    checker = reconciler(rig, STRONG)
    checker.verify_batch([bumped(POST, "likeTally", 4, 5)])
    [finding] = checker.log
    assert status(finding) == "applied"
    marker = rig.value(POST, "tallyRepair")
    writes = [(op, tables) for op, tables in seen if op != "DeleteItem"]  # the outbox's, sent
    assert writes[:3] == [
        ("PutItem", [AUDIT]),  # the marker's record, with the audit items it owes
        ("UpdateItem", [MAIN]),  # the fenced write, alone
        ("TransactWriteItems", [AUDIT] * 5),  # log, finding, standing, outbox, marker's end
    ]
    assert not [t for op, t in seen if op == "TransactWriteItems" and MAIN in t]
    assert (rig.value(POST, "likeTally"), rig.value(POST, "tallyRevision")) == (2, 4)
    [alert] = rig.alerts()
    assert alert["repair"]["status"] == "applied"
    # The write's own record confirms the marker; the repair already finished: nothing owed.
    assert checker._repairer.finish_claimed(marker) is False


def test_on_mrsc_a_fence_that_fails_writes_nothing_and_leaves_the_marker_unfinished(
    rig: Rig,
) -> None:
    rig.likes("POST#a91f", count=2, tally=5, revision=3)
    seen = calls(rig)

    def moved(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "UpdateItem" and params["TableName"] == MAIN:
            params["ExpressionAttributeValues"][":revision"] = {"N": "99"}  # judged on another

    rig.ddb.meta.events.register("before-parameter-build.dynamodb.UpdateItem", moved)
    checker = reconciler(rig, STRONG)
    checker.verify_batch([bumped(POST, "likeTally", 4, 5)])
    assert (rig.value(POST, "likeTally"), rig.value(POST, "tallyRevision")) == (5, 3)
    assert rig.value(POST, "tallyRepair") is None
    assert not [t for op, t in seen if op == "TransactWriteItems" and MAIN in t]
    assert rig.store.log.repairs() == []  # no repair logged, none alerted as applied
    assert all(f["repairStatus"] != "applied" for f in rig.store.log.findings())
    markers = rig.ddb.scan(
        TableName=AUDIT,
        FilterExpression="SK = :m",
        ExpressionAttributeValues={":m": {"S": "MARKER"}},
    )["Items"]
    assert markers and all("pending" in m for m in markers)  # no record will claim them


def test_on_mrsc_no_void_tombstone_and_no_ttl_decrement_is_written(rig: Rig) -> None:
    rig.issues(PROJECT, last=4, numbers=[1, 2, 4])
    checker = reconciler(rig, STRONG)
    checker.recheck(Recheck("issue-numbers", PROJECT, 4, "unbalanced"))
    [gap] = checker.log
    assert gap.kind == "gap" and gap.repair is not None
    assert (gap.repair.status, gap.repair.reason) == ("skipped", NO_TRANSACTION)
    assert rig.item({"PK": "PROJECT#p1", "SK": "ISSUE#0000000003"}) is None
    assert not checker._repairer.may_decrement()
    assert reconciler(rig, None)._repairer.may_decrement()
