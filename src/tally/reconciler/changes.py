"""From stream records to per-(rule, parent) groups of changes, with no reads.

Each record is classified by the rules (parent, child, sequence counter, sequence member,
or unrelated) and folded into its group: counter deltas on one side, child deltas (or
member numbers) on the other. Only the attributes a rule names are deserialized.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer

from tally.reconciler.findings import Evidence, timestamp
from tally.rules import (
    REPAIR_MARKER,
    CountRule,
    IndexMembers,
    Key,
    Match,
    RuleSet,
    SequenceRule,
    SumRule,
)

TTL_PRINCIPAL = "dynamodb.amazonaws.com"
_DESERIALIZER = TypeDeserializer()
_MISSING = object()

AnyRule = CountRule | SumRule | SequenceRule


@dataclass(frozen=True)
class Invalid:
    """A counter (or summed amount) the stream showed holding something it must not."""

    key: Key
    attribute: str
    value: Any
    evidence: Evidence


@dataclass(frozen=True)
class Expiry:
    """A child removed by TTL: DynamoDB deleted it, and no writer adjusted the counter."""

    key: Key
    delta: Decimal
    event_id: str
    evidence: Evidence


@dataclass
class Group:
    """Everything one batch did to one (rule, parent)."""

    rule: AnyRule
    parent_key: Key
    counter_delta: Decimal = Decimal(0)
    child_delta: Decimal = Decimal(0)
    handed_out: Counter[int] = field(default_factory=Counter)
    inserted: Counter[int] = field(default_factory=Counter)
    members_removed: int = 0
    counter_reset: bool = False
    counter_seen: int = 0
    parent_removed: bool = False
    ttl_removed: bool = False
    invalid: list[Invalid] = field(default_factory=list)
    expiries: list[Expiry] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    sequence_numbers: list[str] = field(default_factory=list)
    first_at: Any = None

    @property
    def first_seen(self) -> str | None:
        """Stream time of the group's first record, ISO 8601."""
        return timestamp(self.first_at)

    @property
    def balanced(self) -> bool:
        """Step 1 of the protocol: did this batch's writes cancel out exactly?"""
        if self.invalid or self.parent_removed:
            return False
        if isinstance(self.rule, SequenceRule):
            return (
                not self.counter_reset
                and not self.members_removed
                and (self.handed_out == self.inserted)
            )
        return self.counter_delta == self.child_delta

    @property
    def first_sequence_number(self) -> str:
        return min(self.sequence_numbers, key=int)


@dataclass
class Batch:
    """A batch of stream records, grouped; ``skipped`` counts records no rule cares about."""

    groups: dict[tuple[str, tuple[tuple[str, str], ...]], Group] = field(default_factory=dict)
    records: int = 0
    skipped: int = 0
    own_writes: int = 0
    malformed: list[str] = field(default_factory=list)

    def group(self, match: Match) -> Group:
        id_ = (match.rule.name, _key_id(match.parent_key))
        if id_ not in self.groups:
            self.groups[id_] = Group(match.rule, match.parent_key)
        return self.groups[id_]


def group_records(records: Iterable[Mapping[str, Any]], rules: RuleSet) -> Batch:
    """Fold raw stream records (Lambda's event shape) into groups; never raises per record."""
    batch = Batch()
    for record in records:
        batch.records += 1
        try:
            _fold(record, rules, batch)
        except (KeyError, TypeError, ValueError, AttributeError):
            # A record without keys or sequence number: log it, never block the shard.
            batch.malformed.append(str(record.get("eventID", "?")))
    return batch


def _fold(record: Mapping[str, Any], rules: RuleSet, batch: Batch) -> None:
    stream = record["dynamodb"]
    keys = _keys(stream["Keys"])
    sequence_number = str(stream["SequenceNumber"])
    int(sequence_number)  # a sequence number is a decimal string
    matches = rules.classify(keys)
    if not matches:
        batch.skipped += 1
        return
    new = stream.get("NewImage") or {}
    old = stream.get("OldImage") or {}
    if _own_write(old, new):
        batch.own_writes += 1
        return
    event = record["eventName"]
    at = stream.get("ApproximateCreationDateTime")  # formatted only if it ends up in a finding
    for match in matches:
        group = batch.group(match)
        group.sequence_numbers.append(sequence_number)
        if group.first_at is None and at is not None:
            group.first_at = at
        if match.role == "parent":
            _fold_parent(group, event, keys, old, new, sequence_number, at)
        elif match.role == "child":
            _fold_child(group, record, keys, old, new, sequence_number, at)
        else:
            number = (
                _member_number(match.rule, keys, old),
                _member_number(match.rule, keys, new),
            )
            _fold_member(group, event, keys, number, sequence_number, at)


def _fold_parent(
    group: Group,
    event: str,
    keys: Key,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    sequence_number: str,
    at: Any,
) -> None:
    rule = group.rule
    before, after = _attr(old, rule.counter), _attr(new, rule.counter)
    evidence = Evidence(sequence_number, event, keys, _shown(before), _shown(after), at)
    if event == "REMOVE":
        group.parent_removed = True
        group.evidence.append(evidence)
        return
    if before == after:
        return  # the counter did not move: nothing to balance
    group.evidence.append(evidence)
    if not _valid_counter(rule, after):
        group.invalid.append(Invalid(keys, rule.counter, after, evidence))
        return
    before_n = before if isinstance(before, Decimal) else Decimal(0)
    assert isinstance(after, Decimal)
    if isinstance(rule, SequenceRule):
        if after > before_n:
            group.handed_out.update(range(int(before_n) + 1, int(after) + 1))
        else:
            group.counter_reset = True
        group.counter_seen = max(group.counter_seen, int(after))
    else:
        group.counter_delta += after - before_n


def _fold_child(
    group: Group,
    record: Mapping[str, Any],
    keys: Key,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    sequence_number: str,
    at: Any,
) -> None:
    rule = group.rule
    event = record["eventName"]
    if isinstance(rule, SumRule):
        before, after = _amount(old, rule.summed), _amount(new, rule.summed)
        for value, image in ((before, old), (after, new)):
            if value is None and image:
                invalid = _attr(image, rule.summed)
                evidence = Evidence(sequence_number, event, keys, at=at)
                group.invalid.append(Invalid(keys, rule.summed, invalid, evidence))
                return
        delta = (after or Decimal(0)) - (before or Decimal(0))
    else:
        delta = Decimal({"INSERT": 1, "REMOVE": -1}.get(event, 0))
    if delta == 0:
        return
    evidence = Evidence(sequence_number, event, keys, at=at)
    group.evidence.append(evidence)
    if event == "REMOVE" and _by_ttl(record):
        assert isinstance(rule, CountRule | SumRule)
        if rule.on_ttl_expiry == "decrement":
            group.expiries.append(Expiry(keys, -delta, str(record["eventID"]), evidence))
            return
        group.ttl_removed = True
    group.child_delta += delta


def _fold_member(
    group: Group,
    event: str,
    keys: Key,
    numbers: tuple[int | None, int | None],
    sequence_number: str,
    at: Any,
) -> None:
    before, after = numbers
    if before == after:
        return
    group.evidence.append(Evidence(sequence_number, event, keys, before, after, at))
    if before is not None:
        group.members_removed += 1
    if after is not None:
        group.inserted[after] += 1


def _member_number(rule: AnyRule, keys: Key, image: Mapping[str, Any]) -> int | None:
    """The number a member image holds (None: no image, or not a member of this sequence)."""
    assert isinstance(rule, SequenceRule)
    if not image:
        return None
    members = rule.members
    if not isinstance(members, IndexMembers):
        return rule.member_number(keys[members.attribute])
    if _attr(image, members.sequence_attribute) != rule.sequence_name:
        return None
    number = _attr(image, members.number)
    if isinstance(number, Decimal) and number == int(number) and number > 0:
        return int(number)
    return None


def _valid_counter(rule: AnyRule, value: Any) -> bool:
    if value is _MISSING:
        return True  # an absent counter reads as 0
    if not isinstance(value, Decimal) or not value.is_finite():
        return False
    if isinstance(rule, SumRule):
        return True
    return value >= 0 and value == value.to_integral_value()


def _amount(image: Mapping[str, Any], attribute: str) -> Decimal | None:
    """The summed amount (absent counts 0); None when it holds a non-number."""
    value = _attr(image, attribute)
    if value is _MISSING:
        return Decimal(0)
    return value if isinstance(value, Decimal) and value.is_finite() else None


def _attr(image: Mapping[str, Any], name: str) -> Any:
    raw = image.get(name)
    return _MISSING if raw is None else _DESERIALIZER.deserialize(raw)


def _shown(value: Any) -> Any:
    if value is _MISSING:
        return None
    return value if isinstance(value, Decimal | str | bool | int) else type(value).__name__


def _keys(raw: Mapping[str, Any]) -> Key:
    # Key values stay text, numbers as DynamoDB writes them: no deserializer on the hot path.
    keys = {name: value["S"] if "S" in value else value["N"] for name, value in raw.items()}
    if not keys:
        raise ValueError("stream record has no keys")
    return keys


def _own_write(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    marker = new.get(REPAIR_MARKER)
    return marker is not None and marker != old.get(REPAIR_MARKER)


def _by_ttl(record: Mapping[str, Any]) -> bool:
    identity = record.get("userIdentity") or {}
    return identity.get("type") == "Service" and identity.get("principalId") == TTL_PRINCIPAL


def _key_id(key: Key) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(key.items()))
