"""What a Region's reconciler does with the losses it reads: a damaged record never fails the
batch, the alert stays small and the same loss read again is the same finding, and the
parents are judged in the home Region only."""

from __future__ import annotations

import json
from dataclasses import asdict
from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tally.core.dynamodb import serialize
from tally.reconciler.checks.regions import MAX_PAYLOAD_CHARACTERS, RegionLosses
from tally.reconciler.findings import Finding
from tally.reconciler.protocol.regions import GlobalMode
from tally.reconciler.report.rechecks import Recheck, parse_recheck
from tally.rules import DEFAULT_RULES_FILE, load_rules

US, EU = "us-east-1", "eu-west-1"
RULES = load_rules(DEFAULT_RULES_FILE)
LIKE = {"PK": "POST#1", "SK": "LIKE#USER#7"}


class Table:
    def __init__(self, item: dict[str, Any] | None):
        self.item = item
        self.reads = 0

    def get_item(self, **_: Any) -> dict[str, Any]:
        self.reads += 1
        return {} if self.item is None else {"Item": serialize(self.item)}


class Alerts:
    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def alert_unrepaired(self, finding: Finding) -> None:
        self.findings.append(finding)


def child(made_in: str, mark: str, **more: Any) -> dict[str, Any]:
    return {**LIKE, "tallyOrigin": made_in, "tallyChildId": f"{made_in}:{mark}", **more}


def record(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    return {
        "eventName": "MODIFY",
        "dynamodb": {
            "Keys": serialize(LIKE),
            "OldImage": serialize(old),
            "NewImage": serialize(new),
        },
    }


def losses(region: str, holder: dict[str, Any] | None) -> tuple[RegionLosses, Alerts, Table]:
    alerts, table = Alerts(), Table(holder)
    mode = GlobalMode(region, (US, EU), US, 60)
    return RegionLosses(mode, RULES, table, "t", alerts), alerts, table  # type: ignore[arg-type]


def test_a_lost_child_is_alerted_by_its_region_with_its_attributes_and_the_holders_id() -> None:
    check, alerts, _ = losses(EU, child(US, "b"))
    assert check.read_losses([record(child(EU, "a", note="mine"), child(US, "b"))]) == 1
    [finding] = alerts.findings
    assert (finding.kind, finding.rule, finding.region) == ("overwritten", "likes", EU)
    assert finding.stored == {**LIKE, "note": "mine"}
    assert finding.actual == {"child_id": f"{US}:b", "region": US}


def test_the_same_loss_read_again_after_the_holder_changed_is_the_same_finding() -> None:
    first, a, _ = losses(EU, child(US, "b"))
    again, b, _ = losses(EU, {**child(US, "b"), "note": "changed since"})
    lost = record(child(EU, "a"), child(US, "b"))
    first.read_losses([lost])
    again.read_losses([lost])
    assert a.findings[0].finding_id == b.findings[0].finding_id


def test_two_children_of_one_region_lost_under_one_key_are_two_findings() -> None:
    """Seed 003's writer (its put unconditional) hands a number out again in us once its
    count went back, replacing us's own member a with b; eu's member c then replaces b. Two
    children of us's are lost under one key, with the same attributes, and the key holds c
    when both are read: each is a finding of its own, told apart by the lost child's id."""
    check, alerts, _ = losses(US, child(EU, "c"))
    a, b = child(US, "a", title="taken in us"), child(US, "b", title="taken in us")
    assert check.read_losses([record(a, b), record(b, child(EU, "c"))]) == 2
    first, second = alerts.findings
    assert first.stored == second.stored and first.actual == second.actual
    assert first.finding_id != second.finding_id


def test_a_child_too_large_for_an_alert_is_named_by_its_attributes() -> None:
    check, alerts, _ = losses(EU, child(US, "b"))
    check.read_losses(
        [record(child(EU, "a", body="x" * (MAX_PAYLOAD_CHARACTERS + 1)), child(US, "b"))]
    )
    assert alerts.findings[0].stored == {
        "attributes": ["PK", "SK", "body"],
        "note": "too large for an alert: its names only",
    }


def test_another_regions_loss_costs_no_read() -> None:
    check, alerts, table = losses(US, child(US, "b"))
    assert check.read_losses([record(child(EU, "a"), child(US, "b"))]) == 0
    assert table.reads == 0 and alerts.findings == []


damaged = st.one_of(
    st.none(),
    st.just({"eventName": "MODIFY", "dynamodb": None}),
    st.just({"eventName": "MODIFY", "dynamodb": {"OldImage": {"tallyChildId": {"S": f"{EU}:a"}}}}),
    st.builds(
        lambda n: {
            "eventName": "MODIFY",
            "dynamodb": {
                "Keys": {"PK": {"N": n}},
                "OldImage": {"tallyChildId": {"S": f"{EU}:a"}, "x": {"N": n}},
                "NewImage": {"x": {"N": n}},
            },
        },
        st.sampled_from(["1e400", "abc", "", "NaN"]),
    ),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)


@given(st.lists(damaged, max_size=5))
def test_a_damaged_record_never_fails_the_batch(records: list[Any]) -> None:
    check, alerts, _ = losses(EU, None)
    assert check.read_losses(records) == 0 and alerts.findings == []


def test_the_parents_are_judged_in_the_home_region_only() -> None:
    home, _, _ = losses(US, None)
    away, _, _ = losses(EU, None)
    batch = [record(child(EU, "a"), child(US, "b"))]
    assert home.homed_here(batch) == batch and away.homed_here(batch) == []


# --- three Regions: a loss waits for replication to settle ----------------------------------

AP = "ap-southeast-2"


class Queue:
    """The recheck queue as SQS carries it: each recheck through its JSON body."""

    def __init__(self) -> None:
        self.sent: list[tuple[Recheck, int]] = []

    def send(self, recheck: Recheck, delay: int) -> None:
        body = {k: v for k, v in asdict(recheck).items() if v is not None}
        self.sent.append((parse_recheck(json.dumps(body, default=str)), delay))


def three_regions(region: str, holder: dict[str, Any] | None) -> tuple[RegionLosses, Alerts, Queue]:
    alerts, table, queue = Alerts(), Table(holder), Queue()
    mode = GlobalMode(region, (US, EU, AP), US, 30)
    check = RegionLosses(mode, RULES, table, "t", alerts, queue.send)  # type: ignore[arg-type]
    return check, alerts, queue


def test_with_three_regions_a_loss_is_judged_a_settle_window_later_not_at_once() -> None:
    check, alerts, queue = three_regions(EU, child(US, "b"))
    lost = child(EU, "a", note="mine", stars=Decimal(4))
    assert check.read_losses([record(lost, child(US, "b"))]) == 0
    assert alerts.findings == []
    [(recheck, delay)] = queue.sent
    assert delay == 30 and recheck.rule == "likes" and recheck.key == LIKE
    assert check.judge_lost(recheck)  # still us's child there: lost
    [finding] = alerts.findings
    assert (finding.kind, finding.region) == ("overwritten", EU)
    assert finding.stored == {**LIKE, "note": "mine", "stars": "4"}
    assert finding.actual == {"child_id": f"{US}:b", "region": US}


def test_with_three_regions_a_child_back_once_settled_is_no_loss() -> None:
    check, alerts, queue = three_regions(EU, child(EU, "a", seen=True))  # ap's newer version
    check.read_losses([record(child(EU, "a"), child(US, "b"))])
    [(recheck, _)] = queue.sent
    assert not check.judge_lost(recheck) and alerts.findings == []


def test_the_same_loss_judged_twice_is_one_finding() -> None:
    check, alerts, queue = three_regions(EU, child(US, "b"))
    check.read_losses([record(child(EU, "a"), child(US, "b"))] * 2)  # a redelivered batch
    for recheck, _ in queue.sent:
        check.judge_lost(recheck)
    assert len({f.finding_id for f in alerts.findings}) == 1


@given(
    st.dictionaries(st.sampled_from(["child_id", "winner", "payload", "x"]), st.text(max_size=8))
)
def test_a_forged_loss_recheck_never_raises(lost: dict[str, str]) -> None:
    check, alerts, _ = three_regions(EU, None)
    judged = check.judge_lost(Recheck("likes", LIKE, 0, "forged", lost=lost))
    assert judged == ("child_id" in lost) and len(alerts.findings) == int(judged)


def test_on_mrsc_a_child_replaced_is_an_ordinary_write_not_a_loss() -> None:
    alerts, table = Alerts(), Table(child(US, "b"))
    mode = GlobalMode(EU, (US, EU, AP), US, 5, strong=True)
    check = RegionLosses(mode, RULES, table, "t", alerts)  # type: ignore[arg-type]
    assert check.read_losses([record(child(EU, "a"), child(US, "b"))]) == 0
    assert alerts.findings == [] and table.reads == 0
