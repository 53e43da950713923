"""``tally rules check``: a rules file against a live table, before anything is deployed.

The table's key schema, indexes and stream are compared with the rules; then a sample of
items (a Scan with a limit) is classified, so the author sees how many parents and children
or members each rule finds, and is shown what a wrong rule looks like on real data: parents
whose counter is missing or not a number, members numbered at another width than the rule
writes, and items that sit in a counted item collection but that no rule counts.
Children found through an index (``through``) are counted as the index counts them: the
items keyed like them whose index key names one of the rule's parents; the others (no index
key, another status) are reported, never flagged: a sparse index leaves them out by design.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, cast

from boto3.dynamodb.types import Binary

from tally.reconciler.findings import shown
from tally.rules import (
    AttributeMembers,
    IndexMembers,
    Key,
    RuleSet,
    SequenceRule,
    SumRule,
    TallyRule,
)
from tally.rules.live_table import describe, sample, schema_problems

EXAMPLES = 3  # example keys shown per flag


@dataclass
class RuleView:
    """What one rule sees in the sample."""

    name: str
    kind: str
    parents: int = 0
    claimed: int = 0
    missing: list[Key] = field(default_factory=list)
    # The key and what the counter holds, by type and size: a value may be personal data.
    invalid: list[tuple[Key, str]] = field(default_factory=list)
    odd_width: list[Key] = field(default_factory=list)
    # Children found through an index: the items keyed like them that name no parent there.
    through: str | None = None
    not_counted: int = 0


@dataclass
class Strays:
    """Items no rule counts, in item collections a rule counts in, by sort-key shape."""

    rule: str
    shape: str
    keys: list[Key] = field(default_factory=list)


@dataclass
class CheckReport:
    """The check's outcome; ``flagged`` when anything needs the author's attention."""

    table: str
    sampled: int = 0
    problems: list[str] = field(default_factory=list)
    rules: list[RuleView] = field(default_factory=list)
    strays: list[Strays] = field(default_factory=list)
    unrelated: int = 0

    @property
    def flags(self) -> list[str]:
        flags = list(self.problems)
        for view in self.rules:
            flags += [f"{view.name}: parent {_key(k)} has no counter" for k in view.missing]
            flags += [
                f"{view.name}: parent {_key(k)} holds {v}, not a counter" for k, v in view.invalid
            ]
            flags += [
                f"{view.name}: member {_key(k)} is not numbered at the rule's width"
                for k in view.odd_width
            ]
        for strays in self.strays:
            examples = ", ".join(_key(k) for k in strays.keys[:EXAMPLES])
            flags.append(
                f"{len(strays.keys)} items {strays.shape} sit with {strays.rule!r} items but no "
                f"rule counts them: {examples}"
            )
        return flags

    COLUMNS = ("rule", "kind", "parents", "children/members", "no counter", "not a number")

    def rows(self) -> list[list[Any]]:
        """One row of ``COLUMNS`` per rule."""
        return [
            [v.name, v.kind, v.parents, v.claimed, len(v.missing), len(v.invalid)]
            for v in self.rules
        ]

    def text(self) -> str:
        """The report's lines, the per-rule table left out (``rows`` holds it)."""
        return "\n".join(self.heading() + self.footing())

    def heading(self) -> list[str]:
        return [f"table {self.table}: {self.sampled} items sampled"]

    def footing(self) -> list[str]:
        lines = [f"{self.unrelated} sampled items belong to no rule's item collection"]
        lines += [
            f"{v.name}: {v.not_counted} sampled items keyed like its children name no parent "
            f"through {v.through}: not counted"
            for v in self.rules
            if v.through is not None and v.not_counted
        ]
        return lines + ([f"flag: {flag}" for flag in self.flags] or ["no flags"])

    def as_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "sampled": self.sampled,
            "rules": {
                v.name: {"parents": v.parents, "children_or_members": v.claimed}
                | ({"not_counted": v.not_counted} if v.through is not None else {})
                for v in self.rules
            },
            "unrelated": self.unrelated,
            "flags": self.flags,
        }


def check(rules: RuleSet, client: Any, table_name: str, limit: int) -> CheckReport:
    """Compare the rules with the live table and classify ``limit`` sampled items."""
    report = CheckReport(table_name)
    report.problems = schema_problems(rules, describe(client, table_name))
    if any(problem.startswith("[table]") for problem in report.problems):
        return report  # keys named otherwise: no sampled item could classify
    items = sample(client, table_name, limit)
    report.sampled = len(items)
    views = {rule.name: RuleView(rule.name, rule.kind, through=_through(rule)) for rule in rules}
    report.rules = list(views.values())
    counted: dict[Any, str] = {}  # partition key -> a rule counting in that collection
    unclaimed = []
    for item in items:
        key = rules.key_of(item)
        matches = rules.classify(key)
        if not matches:
            unclaimed.append(key)
            continue
        for match in matches:
            view, rule = views[match.rule.name], match.rule
            if match.role == "shard":
                continue  # a Region's part of a split counter: neither parent nor child
            if match.role == "indexed":
                assert isinstance(rule, TallyRule)
                if rule.indexed_parent(item, rules.table) is None:
                    view.not_counted += 1
                else:
                    view.claimed += 1
                continue
            if view.through is None:  # its children sit in the parent's collection
                counted.setdefault(key[rules.table.partition_key], rule.name)
            if match.role != "parent":
                view.claimed += 1
                if _odd_width(rules, rule, key):
                    view.odd_width.append(key)
                continue
            view.parents += 1
            value = item.get(rule.counter)
            if value is None:
                view.missing.append(key)
            elif not _counter(rule, value):
                view.invalid.append((key, _held(value)))
    report.strays, report.unrelated = _strays(rules, counted, unclaimed)
    return report


def _through(rule: Any) -> str | None:
    """How a rule's children are found through an index, as the report names it."""
    through = rule.through if isinstance(rule, TallyRule) else None
    if through is None:
        return None
    status = f", or {through.sort_key} not {through.sort_prefix}..." if through.sort_prefix else ""
    return f"{through.index} (no {through.partition_key}{status})"


def _counter(rule: Any, value: Any) -> bool:
    if not isinstance(value, Decimal) or not value.is_finite():
        return False
    return isinstance(rule, SumRule) or (value >= 0 and value == value.to_integral_value())


def _held(value: Any) -> str:
    """What a counter holds, as alerts show it: a number, else its type and size only."""
    described = shown(cast(Any, value).value if isinstance(value, Binary) else value)
    return str(described) if isinstance(described, Decimal | bool) else f"a {described}"


def _odd_width(rules: RuleSet, rule: Any, key: Key) -> bool:
    """A member whose number is not written the way the rule writes (and reads) it."""
    if not isinstance(rule, SequenceRule) or isinstance(
        rule.members, IndexMembers | AttributeMembers
    ):
        return False
    number = rule.member_number(key[rule.members.attribute])
    if number is None:
        return False
    counter = rules.classify(key)[0].parent_key
    return rule.member_key(counter, number, rules.table) != key


def _strays(
    rules: RuleSet, counted: dict[Any, str], unclaimed: list[Key]
) -> tuple[list[Strays], int]:
    pk, sk = rules.table.partition_key, rules.table.sort_key
    shapes: dict[tuple[str, str], Strays] = {}
    unrelated = 0
    for key in unclaimed:
        rule = counted.get(key[pk])
        if rule is None or sk is None:
            unrelated += 1
            continue
        shape = _shape(key[sk])
        shapes.setdefault((rule, shape), Strays(rule, shape)).keys.append(key)
    return list(shapes.values()), unrelated


def _shape(value: str) -> str:
    """A sort key's family: up to its first separator (``COMMENT#2024#1`` -> ``COMMENT#*``)."""
    found = re.search(r"[#:|/]", value)
    return value[: found.end()] + "*" if found else re.sub(r"[0-9]+", "<n>", value)


def _key(key: Key) -> str:
    return json.dumps(key, sort_keys=True)
