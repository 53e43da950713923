"""A batch's item collections are verified at once (VERIFY_CONCURRENCY, default 8), through
the function's own wiring: what one batch finds, repairs, alerts and counts is the same as
one collection at a time, and the repair budget holds exactly.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tally.core.settings import settings
from tally.reconciler import runtime
from tally.reconciler.checks import batches
from tally.rules import load_rules
from tally.writers import TallyWriter
from tests.integration.conftest import RULES_FILE, Stack
from tests.utils import serialize

RULES = load_rules(RULES_FILE)
POSTS = [f"POST#many{n:02d}" for n in range(12)]
CLEAN = [f"POST#fine{n:02d}" for n in range(6)]


def posts_then_rogue_bumps(stack: Stack) -> None:
    """Twelve posts with two likes each and a rogue +5 on every one; six posts left clean."""
    writer = TallyWriter(stack.dynamodb, stack.table, RULES)
    for pk in POSTS + CLEAN:
        stack.put({"PK": pk, "SK": "META", "likeTally": 0, "tallyRevision": 0})
        for user in range(2):
            writer.add_child({"PK": pk, "SK": f"LIKE#USER#{user}"})
    stack.settle()
    assert stack.alerts() == []
    for pk in POSTS:
        stack.dynamodb.update_item(
            TableName=stack.table,
            Key=serialize({"PK": pk, "SK": "META"}),
            UpdateExpression="ADD likeTally :k",
            ExpressionAttributeValues={":k": {"N": "5"}},
        )
    for pk in CLEAN:  # balanced traffic beside the faults: proves itself, read nothing
        writer.add_child({"PK": pk, "SK": "LIKE#USER#late"})


def configure(monkeypatch: pytest.MonkeyPatch, **variables: str) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings.cache_clear()


@pytest.mark.parametrize("concurrency", ["1", "8"])
def test_one_batch_over_many_parents_finds_repairs_and_counts_the_same_at_any_concurrency(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, concurrency: str
) -> None:
    posts_then_rogue_bumps(stack)
    configure(monkeypatch, VERIFY_CONCURRENCY=concurrency)
    checker = runtime.reconciler()
    assert checker.concurrency == int(concurrency)
    assert checker.verify_batch(stack.records()) == []
    stats = checker.stats
    assert stats.findings == {"drift": len(POSTS)}
    assert stats.repairs == {"applied": len(POSTS)}
    assert stats.groups == len(POSTS) + len(CLEAN)
    assert stats.balanced == len(CLEAN)
    assert stats.checked == len(POSTS) + len(CLEAN)
    assert stats.alerts == len(POSTS)
    assert checker.table.reads.recounts == len(POSTS)
    assert checker.table.reads.items == len(POSTS) * (2 + 2)  # the parent read twice, 2 likes
    alerts = stack.alerts()
    assert sorted(a["key"]["PK"] for a in alerts) == POSTS
    assert {(a["stored"], a["actual"]) for a in alerts} == {(7, 2)}
    for pk in POSTS:
        assert stack.item(pk, "META")["likeTally"] == 2
    for pk in CLEAN:
        assert stack.item(pk, "META")["likeTally"] == 3


@contextlib.contextmanager
def two_threads_meet(client: Any, when: Callable[[dict[str, Any]], bool]) -> Iterator[set[str]]:
    """The first GetItems (``when`` they match) of two threads wait for each other at a
    barrier: run one at a time, neither would pass it. Yields the threads that met."""
    meeting = threading.Barrier(2, timeout=30)
    met: set[str] = set()

    def read(params: dict[str, Any], **_: Any) -> None:
        thread = threading.current_thread().name
        if when(params) and len(met) < 2 and thread not in met:
            met.add(thread)
            meeting.wait()

    events = client.meta.events
    events.register("provide-client-params.dynamodb.GetItem", read, unique_id="meet")
    try:
        yield met
    finally:
        events.unregister("provide-client-params.dynamodb.GetItem", unique_id="meet")
    assert len(met) == 2 and not meeting.broken


def in_a_worker(params: dict[str, Any]) -> bool:
    return threading.current_thread().name.startswith("verify")


def a_marker_lookup(params: dict[str, Any]) -> bool:
    return str(params["Key"]["PK"]["S"]).startswith("MARKER#")


def test_item_collections_are_verified_at_the_same_time(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two collections' first reads meet at a barrier."""
    posts_then_rogue_bumps(stack)
    configure(monkeypatch, VERIFY_CONCURRENCY="8")
    checker = runtime.reconciler()
    with two_threads_meet(checker.table.client, in_a_worker):
        assert checker.verify_batch(stack.records()) == []
    assert checker.stats.findings == {"drift": len(POSTS)}


def test_the_claims_of_a_batch_are_confirmed_at_the_same_time(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch after the repairs holds their records, each claiming a marker: two claims'
    lookups meet at a barrier, and every claim is confirmed as the reconciler's own write,
    in any order."""
    posts_then_rogue_bumps(stack)
    configure(monkeypatch, VERIFY_CONCURRENCY="8")
    assert runtime.reconciler().verify_batch(stack.records()) == []
    checker = runtime.reconciler()
    with two_threads_meet(checker.store.client, a_marker_lookup):
        assert checker.verify_batch(stack.records()) == []
    assert checker.stats.own_writes == len(POSTS)
    assert checker.stats.findings == {} and checker.stats.errors == []


def test_the_repair_budget_holds_exactly_when_parents_are_repaired_at_once(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    posts_then_rogue_bumps(stack)
    configure(monkeypatch, VERIFY_CONCURRENCY="8", REPAIR_BUDGET="3")
    checker = runtime.reconciler()
    assert checker.verify_batch(stack.records()) == []
    assert checker.stats.repairs == {"applied": 3, "skipped": len(POSTS) - 3}
    repaired = [pk for pk in POSTS if stack.item(pk, "META")["likeTally"] == 2]
    assert len(repaired) == 3
    assert len(stack.alerts()) == len(POSTS)


def test_a_batch_whose_collections_prove_themselves_starts_no_worker(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Balanced groups read nothing: they are verified where they stand, and only the
    collections that need the table go to workers."""
    writer = TallyWriter(stack.dynamodb, stack.table, RULES)
    calm = [f"POST#calm{n:02d}" for n in range(6)]
    for pk in calm:
        stack.put({"PK": pk, "SK": "META", "likeTally": 0, "tallyRevision": 0})
    stack.settle()
    for pk in calm:
        writer.add_child({"PK": pk, "SK": "LIKE#USER#1"})
    configure(monkeypatch, VERIFY_CONCURRENCY="8")
    pools: list[int] = []

    def counted_pool(workers: int, **options: Any) -> ThreadPoolExecutor:
        pools.append(workers)
        return ThreadPoolExecutor(workers, **options)

    monkeypatch.setattr(batches, "ThreadPoolExecutor", counted_pool)
    checker = runtime.reconciler()
    assert checker.verify_batch(stack.records()) == []
    assert pools == []
    assert checker.stats.balanced == len(calm) and checker.table.reads.items == 0

    posts_then_rogue_bumps(stack)  # twelve drifting posts beside six balanced ones
    checker = runtime.reconciler()
    assert checker.verify_batch(stack.records()) == []
    assert pools == [8]
    assert checker.stats.findings == {"drift": len(POSTS)}
