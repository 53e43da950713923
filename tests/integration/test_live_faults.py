"""Live: the pump verifies while writer threads write, a fault injector breaks parents and the
alert topic fails part of the time. Counted per run: false negatives (a broken parent never
alerted), false positives (an alert on a parent nobody broke), lost writes (an acknowledged
write missing from the table, or a counter left unequal to its children)."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest

from tally.reconciler import runtime
from tally.rules import load_rules
from tally.writers import SequenceAllocator, TallyWriter
from tests.harness.faults import Outage
from tests.integration.conftest import RULES_FILE, Stack

RULES = load_rules(RULES_FILE)
POSTS = [f"POST#live{n}" for n in range(10)]
WRITERS, OPERATIONS = 6, 30


@dataclass
class Ledger:
    """What the writers were told, and what the injector broke."""

    likes: dict[str, bool] = field(default_factory=dict)  # child SK -> present, as acknowledged
    lines: dict[str, Decimal] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)  # parent PKs the injector broke
    numbers: int = 0


def parent(pk: str) -> dict[str, str]:
    return {"PK": pk, "SK": "META"}


def write(stack: Stack, ledger: Ledger, thread: int, lock: threading.Lock) -> None:
    """One writer thread: it owns its own children, so its acknowledgements are the truth."""
    rng = random.Random(thread)
    tallies = TallyWriter(stack.dynamodb, stack.table, RULES)
    numbers = SequenceAllocator(stack.dynamodb, stack.table, RULES)
    for op in range(OPERATIONS):
        roll = rng.random()
        if roll < 0.7:
            key = {"PK": rng.choice(POSTS), "SK": f"LIKE#T{thread}#{rng.randrange(6)}"}
            name = f"{key['PK']}/{key['SK']}"
            if rng.random() < 0.65:
                outcome = tallies.add_child(key).outcome
                present = outcome in ("created", "already_present")
            else:
                outcome = tallies.remove_child(key).outcome
                present = outcome not in ("removed", "not_present")
            with lock:
                ledger.likes[name] = present
        elif roll < 0.85:
            key = {"PK": "ORDER#live", "SK": f"LINE#T{thread}#{op}"}
            amount = Decimal(rng.randrange(1, 500)) / 100
            tallies.add_child(key, {"amount": amount})
            with lock:
                ledger.lines[key["SK"]] = amount
        else:
            numbers.allocate({"PK": "PROJECT#live", "SK": "COUNTER#ISSUE"}, strategy="gapless")
            with lock:
                ledger.numbers += 1


def break_parents(stack: Stack, ledger: Ledger, seed: int) -> None:
    """Three kinds of rogue write, each on a parent of its own (so each must be alerted)."""
    rng = random.Random(seed)
    victims = rng.sample(POSTS, 6)
    for n, pk in enumerate(victims):
        if n % 3 == 0:  # a rogue counter overwrite to a value no truth can have
            stack.dynamodb.update_item(
                TableName=stack.table,
                Key={"PK": {"S": pk}, "SK": {"S": "META"}},
                UpdateExpression="SET likeTally = :v",
                ExpressionAttributeValues={":v": {"N": str(10_000 + n)}},
            )
        elif n % 3 == 1:  # a rogue bump
            stack.dynamodb.update_item(
                TableName=stack.table,
                Key={"PK": {"S": pk}, "SK": {"S": "META"}},
                UpdateExpression="ADD likeTally :k",
                ExpressionAttributeValues={":k": {"N": str(rng.randrange(2, 9))}},
            )
        else:  # a child written without its counter, carrying a forged repair marker
            stack.put({"PK": pk, "SK": f"LIKE#ROGUE#{n}", "tallyRepair": f"forged-{n}"})
        ledger.broken.add(pk)


def children(stack: Stack, pk: str, prefix: str) -> list[dict[str, Any]]:
    pages = stack.dynamodb.get_paginator("query").paginate(
        TableName=stack.table,
        KeyConditionExpression="PK = :pk AND begins_with(SK, :p)",
        ExpressionAttributeValues={":pk": {"S": pk}, ":p": {"S": prefix}},
        ConsistentRead=True,
    )
    return [item for page in pages for item in page["Items"]]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_live_verification_under_faults(stack: Stack, seed: int) -> None:
    for pk in POSTS:
        stack.put({**parent(pk), "likeTally": 0, "tallyRevision": 0})
    stack.put({**parent("ORDER#live"), "total": 0, "tallyRevision": 0})
    stack.pump()
    ledger, lock, done = Ledger(), threading.Lock(), threading.Event()
    # The alert topic is down for the first publishes, and loses one response after that.
    down = Outage(runtime._clients()[1], "Publish", "down", times=2)

    def verify_continuously() -> None:
        while not done.is_set():
            stack.pump_retrying(batch_size=random.Random(seed).choice([3, 7, 25]))
            stack.run_rechecks(strict=False)

    verifier = threading.Thread(target=verify_continuously)
    verifier.start()
    try:
        with ThreadPoolExecutor(WRITERS + 1) as pool:
            writers = [pool.submit(write, stack, ledger, t, lock) for t in range(WRITERS)]
            pool.submit(break_parents, stack, ledger, seed).result()
            for future in writers:
                future.result()
    finally:
        done.set()
        verifier.join()
    down.heal()
    lost = Outage(runtime._clients()[1], "Publish", "lost", times=1)
    stack.put({"PK": "POST#live-after", "SK": "META", "likeTally": 3})  # one more fault
    ledger.broken.add("POST#live-after")
    for _ in range(3):
        stack.pump_retrying()
        stack.run_rechecks(strict=False)
    lost.heal()
    stack.settle()

    alerts = stack.alerts()
    alerted = {a["key"]["PK"] for a in alerts}
    false_negatives = ledger.broken - alerted
    false_positives = {a["key"]["PK"] for a in alerts} - ledger.broken
    lost_writes = [
        name
        for name, present in ledger.likes.items()
        if present != bool(stack.item(*name.split("/")))
    ]
    lost_writes += [sk for sk in ledger.lines if stack.item("ORDER#live", sk) is None]
    for pk in [*POSTS, "POST#live-after"]:
        if stack.item(pk, "META")["likeTally"] != len(children(stack, pk, "LIKE#")):  # type: ignore[index]
            lost_writes.append(f"{pk} counter")
    issues = children(stack, "PROJECT#live", "ISSUE#")
    if len(issues) != ledger.numbers or any("void" in i for i in issues):
        lost_writes.append("PROJECT#live numbers")
    report = (len(false_negatives), len(false_positives), len(lost_writes))
    print(f"seed {seed}: false negatives, false positives, lost writes = {report}")
    assert (false_negatives, false_positives, lost_writes) == (set(), set(), [])
    assert {a["kind"] for a in alerts} == {"drift"}
    assert down.failed == 2
