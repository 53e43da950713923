"""Seed 003's optimistic writer as written (the counter holds the next free number, members
are numbered from 0) in every member layout, through the real stream and recheck handlers:
its batches split anywhere, its looks taken at chosen moments on a held clock.

The issue: in an item collection, the first look (watermark 0) read the members from
``ISSUE#0000000001`` on, the key of ordinal 1 taken as a number, so member 0 was never seen
and a false ``gap`` for number 0 was alerted whenever a batch split an allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tally.local.examples import Crash
from tests.harness.seeds import take_next_free
from tests.integration.conftest import Stack, _clear_caches
from tests.integration.test_aggregated_counters import HeldClock
from tests.utils import deserialize, serialize

GRACE = 30
RULE = "numbers"


@dataclass(frozen=True)
class Layout:
    """One member layout of the same sequence: its rule, counter item and member items."""

    name: str
    rule: str  # parent, counter and members of the rule, as TOML
    counter: dict[str, str]
    attribute: str
    member: Callable[[int], dict[str, Any]]


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout(
            "collection",
            'parent = { PK = "PROJECT#*", SK = "COUNTER#ISSUE" }\ncounter = "lastIssue"\n'
            'members = { layout = "collection", SK = "ISSUE#*", width = 10 }',
            {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"},
            "lastIssue",
            lambda n: {"PK": "PROJECT#A", "SK": f"ISSUE#{n:010d}"},
        ),
        Layout(
            "partition",
            'parent = { PK = "COUNTER", SK = "ORDERS" }\ncounter = "count_value"\n'
            'members = { layout = "partition", PK = "ORDER#*", SK = "META", width = 1 }',
            {"PK": "COUNTER", "SK": "ORDERS"},
            "count_value",
            lambda n: {"PK": f"ORDER#{n}", "SK": "META"},
        ),
        Layout(
            "index",
            'parent = { PK = "UserMetadata", SK = "META" }\ncounter = "LastID"\n'
            'members = { layout = "index", key = { PK = "User#*" }, index = "SequenceIndex", '
            'sequence_attribute = "seqName", number = "NumIdentifier" }',
            {"PK": "UserMetadata", "SK": "META"},
            "LastID",
            lambda n: {"PK": f"User#u{n}", "SK": "PROFILE", "seqName": RULE, "NumIdentifier": n},
        ),
        Layout(
            "attribute",
            'parent = { PK = "UserMetadata", SK = "META" }\ncounter = "LastID"\n'
            'members = { layout = "attribute", key = { PK = "User#*" }, number = "NumIdentifier" }',
            {"PK": "UserMetadata", "SK": "META"},
            "LastID",
            lambda n: {"PK": f"User#u{n}", "SK": "PROFILE", "NumIdentifier": n},
        ),
    )
}


@dataclass
class NextFree:
    """One sequence of seed 003's writer, the stream and the rechecks, each moved by hand."""

    stack: Stack
    clock: HeldClock
    layout: Layout
    batch_size: int

    def create(self) -> None:
        """The counter item, created at 0 (the next free number)."""
        self.stack.put({**self.layout.counter, self.layout.attribute: 0})

    def take(self, *, between: Callable[[], Any] | None = None, crash: bool = False) -> int:
        return take_next_free(
            self.stack.dynamodb,
            self.stack.table,
            serialize(self.layout.counter),
            self.layout.attribute,
            lambda value: serialize(self.layout.member(int(value))),
            between=between,
            crash=crash,
        )

    def pump(self) -> int:
        """Everything the stream holds, in batches of ``batch_size``."""
        return len(self.stack.pump(self.batch_size))

    def look(self) -> int:
        """A grace period passes: every recheck due runs; returns how many ran."""
        self.clock.advance(GRACE)
        return self.stack.run_rechecks()

    def settle(self) -> None:
        """Stream and rechecks until both are quiet, a grace period at a time."""
        for _ in range(20):
            if not self.pump() and not self.stack.pending_rechecks():
                return
            self.look()
        raise AssertionError("the stream and the recheck queue never went quiet")

    def watermark(self) -> int:
        return self.stack.audit.watermarks.watermark(RULE, self.layout.counter)

    def voids(self) -> list[dict[str, Any]]:
        items = self.stack.dynamodb.scan(TableName=self.stack.table)["Items"]
        return [item for item in map(deserialize, items) if item.get("void") is True]


def rules(layout: Layout, repair: str) -> str:
    return f"""
[table]
partition_key = "PK"
sort_key = "SK"

[[rules]]
name = "{RULE}"
kind = "sequence"
{layout.rule}
counter_holds = "next"
grace_seconds = {GRACE}
repair = "{repair}"
"""


@pytest.fixture
def next_free(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., NextFree]]:
    clock = HeldClock(monkeypatch)

    def start(layout: str, *, batch_size: int, repair: str = "alert") -> NextFree:
        path = tmp_path / "rules.toml"
        path.write_text(rules(LAYOUTS[layout], repair))
        monkeypatch.setenv("RULES_FILE", str(path))
        _clear_caches()
        return NextFree(stack, clock, LAYOUTS[layout], batch_size)

    yield start


def four_then_a_fifth(sequence: NextFree, look: str) -> None:
    """The issue's run: the counter created at 0, four allocations (0-3, the counter left at
    4), the stream read in batches, then the reconciler's first look and a fifth allocation:
    the look after the four, or between the fifth's counter bump and its member write."""
    sequence.create()
    assert [sequence.take() for _ in range(4)] == [0, 1, 2, 3]
    sequence.pump()
    if look == "after the four":
        sequence.look()
        assert sequence.stack.alerts() == []
        assert sequence.take() == 4
        return

    def look_inside_the_fifth() -> None:
        sequence.look()  # the counter reads 5, member 4 is not written yet
        assert sequence.stack.alerts() == []
        sequence.pump()  # the bump alone: its horizon (5) is judged a grace later

    assert sequence.take(between=look_inside_the_fifth) == 4


LOOKS = ["after the four", "inside the fifth"]


# Batches of 1: the counter's creation apart from the first allocation, every bump apart from
# its member. 2: the creation with the first bump. 3: with the first bump and member 0.
# 4: a batch ending on a bump, the next starting on its member.
@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
@pytest.mark.parametrize("look", LOOKS)
def test_seed_003_in_an_item_collection_raises_no_false_gap_for_number_0(
    next_free: Callable[..., NextFree], batch_size: int, look: str
) -> None:
    issues = next_free("collection", batch_size=batch_size)
    four_then_a_fifth(issues, look)
    issues.settle()
    assert issues.stack.alerts() == []
    # Past number 3 (ordinal 4) at least: a fifth whose bump and member share a batch
    # balances it, and no look is needed to pass it.
    assert issues.watermark() >= 4
    assert issues.voids() == []


@pytest.mark.parametrize("look", LOOKS)
@pytest.mark.parametrize("layout", ["partition", "index", "attribute"])
def test_seed_003_in_every_other_layout_raises_no_false_gap(
    next_free: Callable[..., NextFree], layout: str, look: str
) -> None:
    sequence = next_free(layout, batch_size=2)
    four_then_a_fifth(sequence, look)
    sequence.settle()
    assert sequence.stack.alerts() == []
    assert sequence.watermark() >= 4
    assert sequence.voids() == []


@pytest.mark.parametrize("layout", ["collection", "partition", "index", "attribute"])
def test_a_number_never_written_is_a_gap_shown_by_its_own_number(
    next_free: Callable[..., NextFree], layout: str
) -> None:
    """Numbers 0 and 2 locked and never written (a crash between the lock and the item): two
    gaps, numbered as the writer numbers; each voided under its own key where a key can
    hold it (the attribute layout alerts only)."""
    sequence = next_free(layout, batch_size=1, repair="auto")
    sequence.create()
    for number in range(4):
        if number in (0, 2):
            with pytest.raises(Crash):
                sequence.take(crash=True)
        else:
            assert sequence.take() == number
    sequence.settle()
    alerts = sequence.stack.alerts()
    assert sorted((a["kind"], a["number"]) for a in alerts) == [("gap", 0), ("gap", 2)]
    if layout == "attribute":
        assert {a["repair"]["status"] for a in alerts} == {"skipped"}
        assert sequence.voids() == [] and sequence.watermark() == 0
        return
    assert {a["repair"]["status"] for a in alerts} == {"applied"}
    assert sequence.watermark() == 4
    voided = sorted(sequence.voids(), key=lambda item: (item["PK"], item["SK"]))
    if layout == "index":
        assert [v["NumIdentifier"] for v in voided] == [0, 2]
    else:
        member = sequence.layout.member
        assert [(v["PK"], v["SK"]) for v in voided] == [
            (member(n)["PK"], member(n)["SK"]) for n in (0, 2)
        ]
