"""Attributes the rules keep for themselves, which a caller may not set on a child or member."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tally.core.regions import is_regional
from tally.rules import REPAIR_MARKER, AnyRule, IndexMembers, RuleSet, SequenceRule, TallyRule
from tally.writers.errors import Field, InvalidRequestError


def reserved_attributes(rules: RuleSet, rule: AnyRule) -> dict[str, str]:
    """Each attribute a child or member of ``rule`` may not carry, with the reason."""
    reserved = {name: "is a key attribute: it comes from the key" for name in rules.table.names}
    reserved[REPAIR_MARKER] = "marks the reconciler's own repairs"
    reserved[rule.counter] = f"is rule {rule.name!r}'s counter, kept on its parent"
    if rule.revision:
        reserved[rule.revision] = f"is rule {rule.name!r}'s revision, kept on its parent"
    through = getattr(rule, "through", None)
    if through is not None and through.stamp is not None:
        reserved[through.stamp] = f"is rule {rule.name!r}'s stamp, written by its writers"
    for other in rules:
        if isinstance(other, SequenceRule) and isinstance(other.members, IndexMembers):
            why = f"places the item in rule {other.name!r}'s sequence index"
            reserved[other.members.sequence_attribute] = why
            reserved[other.members.number] = f"holds rule {other.name!r}'s sequence numbers"
    ttl = rules.table.ttl_attribute
    expiry_counts = isinstance(rule, TallyRule) and rule.on_ttl_expiry == "decrement"
    if ttl and not expiry_counts:
        reserved[ttl] = (
            f"is the table's TTL attribute: an expiry would remove the item behind rule "
            f"{rule.name!r}'s back"
        )
    return reserved


def refuse_reserved(
    attributes: Mapping[str, Any], reserved: Mapping[str, str], field: Field
) -> None:
    for name in attributes:
        if name in reserved:
            raise InvalidRequestError((*field, name), f"is reserved: {name!r} {reserved[name]}")


def refuse_regional(attributes: Mapping[str, Any], field: Field) -> None:
    """On a Global Table, the attributes the writers stamp (``tally.core.regions``): a caller's
    own would forge or hide the evidence of a lost write."""
    for name in attributes:
        if is_regional(name):
            raise InvalidRequestError(
                (*field, name), f"is reserved: {name!r} is stamped by the writers of a Global Table"
            )
