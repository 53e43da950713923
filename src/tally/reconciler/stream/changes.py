"""What one stream batch changed: per-(rule, parent) groups of changes, and the records set
aside as claims. ``tally.reconciler.stream.grouping`` folds the records into them, with no reads.

A group holds counter deltas on one side and child deltas (or member numbers) on the
other, with the evidence; whether it balances is the protocol's first step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tally.reconciler.findings import Evidence, timestamp
from tally.reconciler.protocol.balance import counts_balance, numbers_balance
from tally.reconciler.protocol.window import KeyId, Noted, key_id
from tally.rules import AnyRule, Key, Match, SequenceRule


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


@dataclass(frozen=True)
class LedgerChange:
    """A member of an attribute-layout sequence took or gave up a number (ordinals)."""

    key: Key
    before: int | None
    after: int | None
    sequence_number: str


@dataclass
class Group:
    """Everything one batch did to one (rule, parent)."""

    rule: AnyRule
    parent_key: Key
    counter_delta: Decimal = Decimal(0)
    child_delta: Decimal = Decimal(0)
    # Sequences: the numbers the counter handed out, as ranges (a counter may jump by 10^9).
    handed_out: list[tuple[int, int]] = field(default_factory=list)
    inserted: Counter[int] = field(default_factory=Counter)
    members_removed: int = 0
    highest_member: int = 0
    lowest_given_up: int | None = None
    highest_given_up: int = 0
    ledger: list[LedgerChange] = field(default_factory=list)
    decreases: list[Evidence] = field(default_factory=list)
    counter_seen: int = 0
    parent_removed: bool = False
    ttl_removed: bool = False
    unreadable: int = 0
    invalid: list[Invalid] = field(default_factory=list)
    expiries: list[Expiry] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    sequence_numbers: list[str] = field(default_factory=list)
    first_at: Any = None
    # Count/sum: each record's share of the remainder (counter delta - child delta), by
    # sequence number, so a carry adds a redelivered record only once.
    deltas: list[tuple[str, Decimal]] = field(default_factory=list)
    # Count/sum: the counter as the group's first parent record found it (None: not seen).
    counter_before: Decimal | None = None
    # Children found through an index: the parent as the group's last parent record left it
    # (lifecycle.state_of; None: no parent record in the batch).
    parent_state: str | None = None
    # Children found through an index whose count or amount here changed, as each record
    # left them, in stream order (a look counts them so, not as the index shows them, for
    # the rule's window).
    indexed_children: list[Noted] = field(default_factory=list)
    # Children found through an index whose writers stamp (``through.stamp``): per child (by
    # key), the mark of its key and the stamp each of its records here expects on the parent
    # (``protocol.stamps.expected_stamp``: None where no writer's change shows so); and
    # whether a counter change here was not a writer's own (``writers_parent_change``).
    stamped_children: dict[KeyId, tuple[str, list[str | None]]] = field(default_factory=dict)
    unstamped_change: bool = False

    @property
    def first_seen(self) -> str | None:
        """Stream time of the group's first record, ISO 8601."""
        return timestamp(self.first_at)

    @property
    def balanced(self) -> bool:
        """Step 1 of the protocol: did this batch's writes cancel out exactly?"""
        if self.invalid or self.parent_removed or self.unreadable:
            return False
        if isinstance(self.rule, SequenceRule):
            return (
                not self.decreases
                and not self.members_removed
                and numbers_balance(self.handed_out, self.inserted)
            )
        return counts_balance(self.counter_delta, self.child_delta)

    @property
    def may_attest(self) -> bool:
        """Every change here may be a stamped writer's own: no counter change of another's,
        nothing unreadable, invalid, expired or removed with the parent. Attested when the
        parent's stamps agree (``protocol.stamps.attested``)."""
        return not (
            self.unstamped_change
            or self.invalid
            or self.parent_removed
            or self.unreadable
            or self.ttl_removed
            or self.expiries
        )

    @property
    def carriable(self) -> bool:
        """Unbalanced only by its deltas: a remainder a later batch may cancel."""
        return not (
            self.invalid
            or self.parent_removed
            or self.unreadable
            or self.ttl_removed
            or self.expiries
            or isinstance(self.rule, SequenceRule)
        )

    @property
    def horizon(self) -> int:
        """Numbers up to here were handed out by the counter before this batch ended.

        A member's own number is no horizon: a member written above the counter (a rogue, a
        reset) hands out nothing below it, and counter_behind is its finding. Without a
        counter it is: the highest member is the sequence's end.
        """
        if isinstance(self.rule, SequenceRule) and not self.rule.has_counter:
            return max(self.counter_seen, self.highest_member)
        return self.counter_seen

    @property
    def first_sequence_number(self) -> str:
        return min(self.sequence_numbers, key=int)


@dataclass(frozen=True)
class Claim:
    """A record whose repair marker changed: the reconciler's own write, if the audit agrees."""

    record: Mapping[str, Any]
    marker: str
    keys: Key

    @property
    def sequence_number(self) -> str:
        return str(self.record["dynamodb"]["SequenceNumber"])


@dataclass
class Batch:
    """A batch of stream records, grouped; ``skipped`` counts records no rule cares about."""

    groups: dict[tuple[str, tuple[tuple[str, str], ...]], Group] = field(default_factory=dict)
    records: int = 0
    skipped: int = 0
    own_writes: int = 0
    malformed: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)

    def group(self, match: Match) -> Group:
        id_ = (match.rule.name, key_id(match.parent_key))
        if id_ not in self.groups:
            self.groups[id_] = Group(match.rule, match.parent_key)
        return self.groups[id_]
