"""Counters kept by a stream aggregator, against moto: judged a lag later, never repaired."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from tally.audit.full_audit import full_audit
from tally.reconciler.report.rechecks import Recheck, RecheckQueue
from tally.reconciler.verification import Reconciler
from tally.rules import load_rules
from tests.unit.reconciler import test_verification
from tests.unit.reconciler.test_verification import Rig
from tests.utils import stream_record

rig = test_verification.rig  # the same moto tables, topic and queues

RULES = load_rules(Path(__file__).parents[3] / "examples" / "adopting" / "carts" / "rules.toml")
CART = {"PK": "CART#1", "SK": "TOTAL"}
LAG = 90


class Scheduled(RecheckQueue):
    """The recheck queue, keeping what was scheduled and with which delay."""

    def __init__(self) -> None:
        self.sent: list[tuple[Recheck, int]] = []

    def schedule(self, recheck: Recheck, delay_seconds: int) -> None:
        self.sent.append((recheck, delay_seconds))


def cart(rig: Rig, total: Any, quantities: list[int]) -> None:
    """CART#1 with its products; ``total`` None: the aggregator has not written it yet."""
    if total is not None:
        rig.put({**CART, "quantity": total})
    for n, quantity in enumerate(quantities):
        rig.put({"PK": "CART#1", "SK": f"PRODUCT#{n}", "quantity": quantity})


def checker(rig: Rig) -> tuple[Reconciler, Scheduled]:
    scheduled = Scheduled()
    return rig.reconciler(rules=RULES, rechecks=scheduled), scheduled


def later(rig: Rig, observed: tuple[str | None, str] | None) -> tuple[Reconciler, Scheduled]:
    """A fresh invocation running the recheck that carried ``observed``."""
    found, scheduled = checker(rig)
    found.recheck(Recheck("cart-quantity", CART, 0, "aggregated counter unbalanced", observed))
    return found, scheduled


def test_an_unbalanced_batch_reads_nothing_and_waits_out_the_lag(rig: Rig) -> None:
    cart(rig, 0, [2])
    found, scheduled = checker(rig)
    product = {"PK": "CART#1", "SK": "PRODUCT#0"}
    assert found.verify_batch([stream_record("INSERT", product, {"quantity": 2})]) == []
    assert found.table.reads.recounts == 0 and found.log == [] and rig.alerts() == []
    [(recheck, delay)] = scheduled.sent
    assert (recheck.rule, recheck.key, recheck.observed, delay) == (
        "cart-quantity",
        CART,
        None,
        LAG,
    )


def test_a_balanced_batch_needs_no_recheck(rig: Rig) -> None:
    found, scheduled = checker(rig)
    product = {"PK": "CART#1", "SK": "PRODUCT#0"}
    batch = [
        stream_record("INSERT", product, {"quantity": 2}),
        stream_record("MODIFY", CART, {"quantity": 2}, {"quantity": 0}),
    ]
    assert found.verify_batch(batch) == []
    assert scheduled.sent == [] and found.stats.balanced == 1


def test_a_counter_caught_up_after_the_lag_is_consistent(rig: Rig) -> None:
    cart(rig, 5, [2, 3])
    found, scheduled = later(rig, None)
    assert scheduled.sent == [] and found.log == [] and found.stats.consistent == 1


def test_a_first_recount_off_only_looks_again_a_lag_later(rig: Rig) -> None:
    cart(rig, 2, [2, 3])
    found, scheduled = later(rig, None)
    assert found.log == [] and rig.alerts() == []
    [(recheck, delay)] = scheduled.sent
    assert (recheck.observed, delay) == (("2", "5"), LAG)


def test_the_same_counter_and_truth_a_lag_apart_is_drift_alerted_not_repaired(rig: Rig) -> None:
    cart(rig, 2, [2, 3])
    found, scheduled = later(rig, ("2", "5"))
    [finding] = found.log
    assert (finding.kind, finding.stored, finding.actual) == ("drift", 2, 5)
    assert finding.repair is not None and finding.repair.status == "skipped"
    assert "90 s apart" in finding.detail
    assert scheduled.sent == []
    assert rig.value(CART, "quantity") == 2  # never written under the aggregator
    [alert] = rig.alerts()
    assert (alert["kind"], alert["repair"]["status"]) == ("drift", "skipped")


def test_numbers_are_compared_as_numbers_not_text(rig: Rig) -> None:
    cart(rig, Decimal("2.5"), [2, 3])
    found, _ = later(rig, ("2.50", "5.0"))
    assert [f.kind for f in found.log] == ["drift"]


def test_an_offset_that_moved_is_left_to_the_records_that_moved_it(rig: Rig) -> None:
    cart(rig, 4, [2, 3])  # the aggregator landed part of the pending deltas
    found, scheduled = later(rig, ("2", "5"))
    assert found.log == [] and scheduled.sent == []


def test_the_same_offset_on_a_parent_that_moved_is_looked_at_once_more(rig: Rig) -> None:
    cart(rig, 3, [2, 3, 1])  # a product and its delta both landed; the offset stayed -3
    found, scheduled = later(rig, ("2", "5"))
    assert found.log == []
    [(recheck, _)] = scheduled.sent
    assert recheck.observed == ("3", "6")


def test_children_without_their_total_a_lag_apart_are_orphans(rig: Rig) -> None:
    cart(rig, None, [4])
    first, scheduled = later(rig, None)
    assert first.log == []
    [(recheck, _)] = scheduled.sent
    assert recheck.observed == (None, "1")
    second, _ = later(rig, recheck.observed)
    assert [(f.kind, f.stored, f.actual) for f in second.log] == [("orphans", None, 1)]


def test_a_counter_that_is_not_a_number_is_reported_at_once(rig: Rig) -> None:
    cart(rig, "many", [2])
    found, scheduled = later(rig, None)
    assert [f.kind for f in found.log] == ["invalid_counter"] and scheduled.sent == []


def test_the_full_audit_takes_a_first_look_and_judges_a_lag_later(rig: Rig) -> None:
    cart(rig, 2, [2, 3])
    found, scheduled = checker(rig)
    full_audit(found, rule="cart-quantity")
    assert found.log == []
    [(recheck, delay)] = scheduled.sent
    assert (recheck.key, recheck.observed, delay) == (CART, ("2", "5"), LAG)


def test_a_carry_recheck_left_from_before_the_lag_is_judged_after_the_lag(rig: Rig) -> None:
    """A rule switched to ``lag_seconds`` with a carry's recheck still queued: the recheck is
    a first sight, never an immediate finding on a total the aggregator may still change."""
    cart(rig, 0, [2, 3])  # the aggregator has not added these yet
    found, scheduled = checker(rig)
    found.recheck(Recheck("cart-quantity", CART, 0, "carried remainder", None, 1234))
    assert found.log == [] and rig.alerts() == []
    [(recheck, delay)] = scheduled.sent
    assert (recheck.observed, recheck.carry_since, delay) == (("0", "5"), 0, LAG)
