"""Values read out of a stream record: its keys, the attributes its images hold, its marker
and whether TTL removed it. Only the attributes asked for are deserialized."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import Deserializer
from tally.reconciler.findings import shown
from tally.rules import REPAIR_MARKER, AnyRule, AttributeMembers, IndexMembers, Key, SequenceRule

TTL_PRINCIPAL = "dynamodb.amazonaws.com"
_DESERIALIZER = Deserializer()
MISSING = object()  # the attribute is not in the image


def member_number(rule: AnyRule, keys: Key, image: Mapping[str, Any]) -> int | None:
    """The ordinal a member image holds (None: no image, or not a member of this sequence)."""
    if not image or not isinstance(rule, SequenceRule):
        return None
    members = rule.members
    if isinstance(members, AttributeMembers):
        return rule.attribute_number(attr(image, members.number))
    if not isinstance(members, IndexMembers):
        value = keys.get(members.attribute)
        return rule.member_number(value) if value is not None else None
    if attr(image, members.sequence_attribute) != rule.sequence_name:
        return None
    return rule.attribute_number(attr(image, members.number))


def amount(image: Mapping[str, Any], attribute: str) -> Decimal | None:
    """The summed amount (absent counts 0); None when it holds a non-number."""
    value = attr(image, attribute)
    if value is MISSING:
        return Decimal(0)
    return value if isinstance(value, Decimal) and value.is_finite() else None


def attr(image: Mapping[str, Any], name: str) -> Any:
    raw = image.get(name)
    return MISSING if raw is None else _DESERIALIZER.deserialize(raw)


def shown_value(value: Any) -> Any:
    return None if value is MISSING else shown(value)


def record_keys(raw: Mapping[str, Any]) -> Key:
    # Key values stay text, numbers as DynamoDB writes them: no deserializer on the hot path.
    keys = {name: value["S"] if "S" in value else value["N"] for name, value in raw.items()}
    if not keys:
        raise ValueError("stream record has no keys")
    return keys


def marker_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """The repair marker this write set, if it set a new one (any client can, so it is a claim)."""
    marker = new.get(REPAIR_MARKER)
    if marker is None or marker == old.get(REPAIR_MARKER):
        return None
    value = marker.get("S") if isinstance(marker, Mapping) else None
    return value if isinstance(value, str) else ""


def removed_by_ttl(record: Mapping[str, Any]) -> bool:
    identity = record.get("userIdentity") or {}
    if not isinstance(identity, Mapping):
        return False
    return identity.get("type") == "Service" and identity.get("principalId") == TTL_PRINCIPAL
