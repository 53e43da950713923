"""A counter split per Region, reconciled where no Global Table is configured (no
``GLOBAL_REGIONS``): the stream handler and the full audit read base + shards as the counter,
a writers' batch balances with no read, and a drift is alerted but never repaired, since only
a home Region repairs one, through its own shard (docs/verification.md, "Counters split per
Region")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.audit.full_audit import full_audit
from tally.reconciler import runtime
from tally.rules import load_rules
from tally.writers import TallyWriter
from tests.integration.conftest import Stack, _clear_caches

RULES_FILE = Path(__file__).with_name("split_rules.toml")
RULES = load_rules(RULES_FILE)
US, EU = "us-east-1", "eu-west-1"
POST = "SPLITPOST#1"


@pytest.fixture
def split_stack(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    monkeypatch.setenv("RULES_FILE", str(RULES_FILE))
    _clear_caches()
    yield stack
    _clear_caches()


def likes(stack: Stack) -> None:
    stack.put({"PK": POST, "SK": "META", "likeTally": 2})  # a base of 2, from before the split
    stack.put({"PK": POST, "SK": "LIKE#old1"})
    stack.put({"PK": POST, "SK": "LIKE#old2"})
    stack.records()  # the parent and its children as they were before the split
    for region, users in ((US, "abc"), (EU, "de")):
        writer = TallyWriter(stack.dynamodb, stack.table, RULES, region=region)
        for user in users:
            assert writer.add_child({"PK": POST, "SK": f"LIKE#{user}"}).outcome == "created"


def test_the_writers_batches_balance_and_the_full_audit_reads_base_and_shards(
    split_stack: Stack,
) -> None:
    likes(split_stack)
    split_stack.pump()
    assert split_stack.alerts() == []
    report = full_audit(runtime.reconciler(), rule="split-likes")
    assert report.parents == {"split-likes": 1}
    assert report.findings == {} and report.recounted == 0  # 2 + 3 + 2 = 7 children


def test_a_rogue_shard_write_is_alerted_and_not_repaired_without_a_home_region(
    split_stack: Stack,
) -> None:
    likes(split_stack)
    split_stack.pump()
    split_stack.put({"PK": POST, "SK": f"META#REGION#{EU}", "likeTally": 9})  # was 2
    split_stack.pump()
    [alert] = split_stack.alerts()
    assert (alert["kind"], alert["key"], alert["stored"], alert["actual"]) == (
        "drift",
        {"PK": POST, "SK": "META"},
        14,
        7,
    )
    assert alert["repair"]["status"] == "skipped"
    assert "home Region's own shard" in alert["repair"]["reason"]
    assert f"base 2; shards {EU}: 9, {US}: 3" in alert["detail"]
    shards = [split_stack.item(POST, f"META#REGION#{r}") for r in (US, EU)]
    assert [s["likeTally"] for s in shards if s] == [3, 9]  # nothing written
