"""The full audit of children found through an index, on DynamoDB Local: both engines
nominate exactly the parents whose counters the base table contradicts, and report the items
keyed as children that the index cannot hold.

The table is the template's, without the rules' indexes: the items below are as a table holds
them when they were written before the index was created (DynamoDB then leaves the ones it
cannot index out of it, silently; once the index exists it refuses such writes). The recount
of a nominated parent through the index is the reconciler's; here it is replaced by a spy
that records what the engines hand it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tally.audit.full_audit import full_audit
from tally.audit.report import AuditReport
from tally.local.audit_duckdb import duckdb_audit
from tally.local.exports import read_export, write_export
from tally.reconciler import runtime
from tally.reconciler.verification import Reconciler
from tests.integration.conftest import Stack, _clear_caches

RULES = """
[[rules]]
name = "followers"
kind = "count"
parent = { PK = "USER#*", SK = "PROFILE" }
children = { PK = "USER#*", SK = "FOLLOWS#*" }
counter = "followerCount"
repair = "alert"
[rules.through]
index = "GSI1"
partition_key = "GSI1PK"
sort_key = "GSI1SK"
sort_prefix = "FOLLOWING#"

[[rules]]
name = "product-totals"
kind = "sum"
parent = { PK = "PRODUCT#*", SK = "TOTALQUANTITY" }
children = { PK = "CART#*", SK = "PRODUCT#*" }
counter = "quantity"
summed = "quantity"
lag_seconds = 5
repair = "alert"
[rules.through]
index = "Inverted"
partition_key = "SK"
sort_key = "PK"
"""

# The edges the index cannot hold: (follower, what its index keys hold).
UNINDEXED = {
    "USER#u1": {},  # no index key at all
    "USER#u2": {"GSI1PK": Decimal(7), "GSI1SK": "FOLLOWING#1"},  # a number for an S key
    "USER#u3": {"GSI1PK": "USER#bob"},  # no index sort key
    "USER#u4": {"GSI1PK": "USER#bob", "GSI1SK": {"since": "tokenvalue"}},  # a map
}
NOMINATED = {
    ("followers", "USER#cy"),  # counter 0, one re-parented edge names him
    ("followers", "USER#gone"),  # followed, no profile: orphans
    ("product-totals", "PRODUCT#b"),  # 9 for 1 across carts
}


@pytest.fixture
def indexed(stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Stack:
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    monkeypatch.setenv("RULES_FILE", str(rules))
    _clear_caches()
    return stack


def edge(follower: str, followee: str, status: str = "FOLLOWING#2026-11-26", **index: Any) -> Any:
    names = index or {"GSI1PK": f"USER#{followee}", "GSI1SK": status}
    return {"PK": follower, "SK": f"FOLLOWS#{followee}"} | names


def seed(stack: Stack) -> None:
    # The followee's id is in each edge's index key, spread over many item collections.
    stack.put({"PK": "USER#bob", "SK": "PROFILE", "followerCount": 2})
    for follower in ("USER#ann", "USER#dan"):
        stack.put(edge(follower, "bob"))
    stack.put(edge("USER#eve", "bob", "BLOCKED#2026"))  # another status: not counted
    # Keyed as following bob, but its index key names cy (re-parented): cy's, who says 0.
    stack.put(edge("USER#fay", "bob", GSI1PK="USER#cy", GSI1SK="FOLLOWING#1"))
    stack.put({"PK": "USER#cy", "SK": "PROFILE", "followerCount": 0})
    stack.put(edge("USER#ann", "gone"))
    for follower, index in UNINDEXED.items():
        stack.put({"PK": follower, "SK": "FOLLOWS#bob"} | index)
    # Product totals across carts: a is right (2 + 3), b says 9 for 1.
    stack.put({"PK": "PRODUCT#a", "SK": "TOTALQUANTITY", "quantity": 5})
    stack.put({"PK": "CART#1", "SK": "PRODUCT#a", "quantity": 2})
    stack.put({"PK": "CART#2", "SK": "PRODUCT#a", "quantity": 3})
    stack.put({"PK": "PRODUCT#b", "SK": "TOTALQUANTITY", "quantity": 9})
    stack.put({"PK": "CART#2", "SK": "PRODUCT#b", "quantity": 1})
    stack.records()


def spied(
    monkeypatch: pytest.MonkeyPatch, first: Callable[[], None] = lambda: None
) -> tuple[Reconciler, list[tuple[str, str]]]:
    """A reconciler whose recount records the parents handed to it (``first`` runs at the
    first: between the engine's reading and its unindexed items' second read)."""
    checker = runtime.reconciler()
    handed: list[tuple[str, str]] = []

    def audit_parent(rule: Any, key: dict[str, str]) -> None:
        if not handed:
            first()
        handed.append((rule.name, key["PK"]))
        assert key["SK"] == {"followers": "PROFILE"}.get(rule.name, "TOTALQUANTITY")

    monkeypatch.setattr(checker, "audit_parent", audit_parent)
    return checker, handed


def audit(engine: str, checker: Reconciler, stack: Stack, tmp_path: Path) -> AuditReport:
    if engine == "scan":
        return full_audit(checker, segments=3)
    out = tmp_path / f"export-{len(list(tmp_path.iterdir()))}"
    write_export(stack.dynamodb, stack.table, out, segments=3, items_per_file=5)
    return duckdb_audit(checker, read_export(out))


@pytest.mark.parametrize("engine", ["scan", "duckdb"])
def test_both_engines_nominate_the_parents_the_base_table_contradicts(
    indexed: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    seed(indexed)
    checker, handed = spied(monkeypatch)
    report = audit(engine, checker, indexed, tmp_path)

    assert sorted(handed) == sorted(NOMINATED)  # each once, nothing else
    assert report.unindexed == len(UNINDEXED)
    assert report.findings == {"unindexed": len(UNINDEXED)}
    assert report.repairs == {"skipped": len(UNINDEXED)}
    alerts = {a["key"]["PK"]: a for a in indexed.alerts()}
    assert set(alerts) == set(UNINDEXED)
    assert {k: (a["attribute"], a["stored"]) for k, a in alerts.items()} == {
        "USER#u1": ("GSI1PK", None),
        "USER#u2": ("GSI1PK", "N"),
        "USER#u3": ("GSI1SK", None),
        "USER#u4": ("GSI1SK", "M"),
    }
    u4 = alerts["USER#u4"]
    assert (u4["kind"], u4["rule"], u4["key"]["SK"]) == ("unindexed", "followers", "FOLLOWS#bob")
    assert u4["repair"]["status"] == "skipped"
    assert "tokenvalue" not in json.dumps(u4)  # the type, never the value
    assert {off.finding.key["PK"] for off in report.state} == set(UNINDEXED)

    again = audit(engine, spied(monkeypatch)[0], indexed, tmp_path)
    assert again.unindexed == len(UNINDEXED)
    assert indexed.alerts() == []  # already alerted: standing, not news
    assert {off.status for off in again.state if off.finding.kind == "unindexed"} == {"standing"}


@pytest.mark.parametrize("engine", ["scan", "duckdb"])
def test_an_item_indexed_or_deleted_since_the_engine_read_it_is_not_reported(
    indexed: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    seed(indexed)

    def meanwhile() -> None:
        indexed.put(edge("USER#u1", "bob"))  # given its index keys
        indexed.delete("USER#u2", "FOLLOWS#bob")

    checker, _ = spied(monkeypatch, meanwhile)
    report = audit(engine, checker, indexed, tmp_path)

    assert report.unindexed == len(UNINDEXED)  # what the engine saw
    reported = {a["key"]["PK"] for a in indexed.alerts()}
    assert reported == set(UNINDEXED) - {"USER#u1", "USER#u2"}  # what a second read confirms
