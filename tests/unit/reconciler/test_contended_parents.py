"""A parent written from several Regions that keeps losing increments is escalated as
``contended`` instead of repaired again and again (docs/global-tables.md)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tally.core.regions import writes, writing_regions
from tally.reconciler.checks.regions import Contention
from tally.reconciler.findings import Finding
from tally.reconciler.protocol.regions import CONTENDED_WINDOW_SECONDS, GlobalMode, contended
from tally.rules import DEFAULT_RULES_FILE, load_rules

US, EU, AP = "us-east-1", "eu-west-1", "ap-southeast-2"
RULES = load_rules(DEFAULT_RULES_FILE)
POST = {"PK": "POST#1", "SK": "META"}

counts = st.one_of(
    st.integers(-3, 3),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.booleans(),
    st.none(),
)


@given(
    st.dictionaries(st.sampled_from([US, EU, AP, ""]), counts), st.integers(0, 6), st.integers(1, 5)
)
def test_contended_names_the_regions_of_a_stamped_parent_repaired_often(
    stamps: dict[str, Any], repairs: int, after: int
) -> None:
    parent = {**POST, "likeTally": Decimal(3), **{writes(r): n for r, n in stamps.items()}}
    writing = sorted(
        r
        for r, n in stamps.items()
        if r
        and not isinstance(n, bool)
        and isinstance(n, (int, Decimal))
        and (not isinstance(n, Decimal) or n.is_finite())
        and n > 0
    )
    got = contended(parent, repairs, after)
    assert writing_regions(parent) == tuple(writing)
    assert got == (tuple(writing) if writing and repairs >= after else ())


def test_a_parent_no_writer_stamped_is_never_contended() -> None:
    assert contended({**POST, "likeTally": 9}, 100, 1) == ()
    assert contended(None, 100, 1) == ()


class Log:
    def __init__(self, repairs: int):
        self.repairs = repairs
        self.asked: list[tuple[str, dict[str, str], float]] = []

    def clock(self) -> float:
        return 1_000_000.0

    def repairs_since(self, rule: str, key: dict[str, str], since: float) -> int:
        self.asked.append((rule, key, since))
        return self.repairs


class Parents:
    def __init__(self, item: dict[str, Any]):
        self.item = item
        self.reads = 0

    def parent_item(self, key: Any) -> dict[str, Any]:
        self.reads += 1
        return self.item


def drift() -> Finding:
    return Finding("drift", "likes", "t", POST, "likeTally", Decimal(3), Decimal(4), detail="off")


def contention(repairs: int, item: dict[str, Any]) -> tuple[Contention, Log, Parents]:
    log, parents = Log(repairs), Parents(item)
    mode = GlobalMode(US, (US, EU), US, 5, contended_after=3)
    return Contention(mode, log, parents), log, parents  # type: ignore[arg-type]


def test_below_the_threshold_the_parent_is_repaired_and_not_even_read() -> None:
    check, log, parents = contention(2, {**POST, writes(US): 4, writes(EU): 2})
    rule = RULES["likes"]
    assert check.escalated(rule, POST, drift()) is None  # type: ignore[arg-type]
    assert log.asked == [("likes", POST, 1_000_000.0 - CONTENDED_WINDOW_SECONDS)]
    assert parents.reads == 0


def test_at_the_threshold_a_parent_written_from_two_regions_is_escalated() -> None:
    check, _, parents = contention(3, {**POST, writes(US): 4, writes(EU): 2})
    escalated = check.escalated(RULES["likes"], POST, drift())  # type: ignore[arg-type]
    assert escalated is not None and parents.reads == 1
    assert (escalated.kind, escalated.region, escalated.severity) == ("contended", US, "critical")
    assert (escalated.stored, escalated.actual) == (Decimal(3), Decimal(4))
    assert f"{EU}, {US}" in escalated.detail and "repaired 3 times" in escalated.detail
    check, _, _ = contention(3, {**POST, writes(EU): 2})  # us always lost: no stamp of it
    escalated = check.escalated(RULES["likes"], POST, drift())  # type: ignore[arg-type]
    assert escalated is not None and "holds writes from eu-west-1:" in escalated.detail
    assert escalated.finding_id != drift().finding_id


def test_a_parent_no_stamping_writer_wrote_that_keeps_drifting_is_repaired_as_ever() -> None:
    check, _, _ = contention(50, {**POST, "likeTally": 3, writes(US): 0})
    assert check.escalated(RULES["likes"], POST, drift()) is None  # type: ignore[arg-type]


def test_on_mrsc_a_parent_is_never_contended_however_often_repaired() -> None:
    log, parents = Log(50), Parents({**POST, writes(US): 4, writes(EU): 2})
    mode = GlobalMode(US, (US, EU, AP), US, 5, contended_after=3, strong=True)
    check = Contention(mode, log, parents)  # type: ignore[arg-type]
    assert check.escalated(RULES["likes"], POST, drift()) is None  # type: ignore[arg-type]
    assert parents.reads == 0


def test_a_counter_split_per_region_is_never_contended_however_often_repaired() -> None:
    check, log, parents = contention(50, {**POST, writes(US): 4, writes(EU): 2})
    split = RULES["likes"].model_copy(update={"split": "region"})
    assert check.escalated(split, POST, drift()) is None  # type: ignore[arg-type]
    assert (log.asked, parents.reads) == ([], 0)  # not even counted: no shard races
