"""The stream's ``FilterCriteria`` pattern, derived from the rules (``tally rules filter``).

Lambda drops records that match no filter before it invokes the reconciler, so the pattern
admits every key some rule cares about (parents, children, members) and, where event
filtering can say so, nothing else. Only the partition key is filtered: children share
their parent's, and INSERT, MODIFY and REMOVE (TTL deletes too) must all pass.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from tally.core.regions import HEARTBEAT_PREFIX
from tally.rules.key_patterns import Pattern
from tally.rules.rule_set import RuleSet
from tally.rules.tally_rules import TallyRule

_EVERYTHING: list[Any] = [{"exists": True}]


def partition_patterns(rules: RuleSet) -> list[Pattern] | None:
    """Every partition-key pattern a key some rule cares about can have; None if any may."""
    pk = rules.table.partition_key
    patterns: list[Pattern] = []
    for rule in rules:
        claimed = (
            rule.child_pattern(rules.table)
            if isinstance(rule, TallyRule)
            else rule.member_pattern(rules.table)
        )
        if pk not in claimed:
            return None  # index members keyed by another attribute: the key says nothing
        patterns += [rule.parent_pattern(rules.table)[pk], claimed[pk]]
    return patterns


def filter_pattern(rules: RuleSet, *, heartbeats: bool = False) -> dict[str, Any]:
    """The event filtering pattern, as a dict; with ``heartbeats`` (a Global Table), the
    Regions' heartbeat items too, by their partition key's prefix."""
    table = rules.table
    patterns = partition_patterns(rules)
    elements = _EVERYTHING if patterns is None else _elements(patterns)
    if heartbeats and elements != _EVERYTHING:
        if table.partition_key_type != "S":
            raise ValueError(
                f"partition key {table.partition_key!r} is a {table.partition_key_type}: the "
                "heartbeat item needs a string key (docs/global-tables.md)"
            )
        elements = [*elements, {"prefix": HEARTBEAT_PREFIX}]
    return {"dynamodb": {"Keys": {table.partition_key: {table.partition_key_type: elements}}}}


def filter_json(rules: RuleSet, *, heartbeats: bool = False) -> str:
    """The pattern as the template's ``StreamFilterPattern`` parameter takes it."""
    return json.dumps(filter_pattern(rules, heartbeats=heartbeats), separators=(",", ":"))


def _elements(patterns: list[Pattern]) -> list[Any]:
    elements: list[Any] = []
    for pattern in patterns:
        for element in _admitting(pattern):
            if element == _EVERYTHING[0]:
                return _EVERYTHING
            if element not in elements:
                elements.append(element)
    prefixes = [e["prefix"] for e in elements if isinstance(e, dict) and "prefix" in e]
    # An element a shorter prefix already admits adds nothing.
    return [e for e in elements if not _covered(e, prefixes)]


def _admitting(pattern: Pattern) -> list[Any]:
    if pattern.numeric:
        if pattern.is_prefix:
            return [{"numeric": [">", 0]}]
        return [{"numeric": ["=", _json_number(Decimal(pattern.value))]}]
    if not pattern.is_prefix:
        return [pattern.value]
    if pattern.numbered:  # the prefix, then a digit: event filtering has no "digits only"
        return [{"prefix": pattern.value + digit} for digit in "0123456789"]
    return [{"prefix": pattern.value}] if pattern.value else _EVERYTHING


def _covered(element: Any, prefixes: list[str]) -> bool:
    text = element if isinstance(element, str) else element.get("prefix")
    if text is None:
        return False
    own = None if isinstance(element, str) else text
    return any(text.startswith(p) and p != own for p in prefixes)


def _json_number(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)
