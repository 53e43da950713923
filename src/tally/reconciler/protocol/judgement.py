"""Step 2's judgement: a parent's counter, as one settled read saw it, against the truth
counted from its children."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from tally.core.numbers import ONE, add, counter_problem, fit, representable
from tally.reconciler.protocol.shards import Shards
from tally.rules import CountRule, Key, SequenceRule, SumRule, TallyRule

Kind = Literal[
    "drift",
    "gap",
    "duplicate",
    "counter_behind",
    "invalid_counter",
    "ttl_removal",
    "orphans",
    "malformed",
    "unrepresentable",
    "unindexed",
    "overwritten",
    "contended",
    "replication_stalled",
]
_ABSENT = None


@dataclass(frozen=True)
class ParentState:
    """A parent's (or sequence counter's) counter and revision, as one consistent read saw them."""

    exists: bool
    counter: Any = _ABSENT
    revision: Any = _ABSENT
    # Children found through an index, a rule with ``stamp``: the writers' last tokens,
    # newest first ("" where none yet). They move with the revision.
    stamps: tuple[str, ...] = field(default=(), compare=False)
    # And the key of the child of the newest stamp, as the writer wrote it (JSON), if any.
    stamped_child: str | None = field(default=None, compare=False)
    # And what the writers' stamped changes added to the counter (``<stamp>Total``).
    stamped_total: Any = field(default=None, compare=False)
    # A counter split per Region (``protocol.shards``): ``counter`` is the total, ``base``
    # the parent's own counter attribute, ``shards`` each Region's shard as read.
    base: Any = _ABSENT
    shards: Shards = ()

    def same_as(self, other: ParentState) -> bool:
        return (self.exists, self.counter, self.revision, self.base, self.shards) == (
            other.exists,
            other.counter,
            other.revision,
            other.base,
            other.shards,
        )


@dataclass(frozen=True)
class ChildTotal:
    """The truth counted from the children (an exact sum, which may need more digits than a
    counter holds), and children whose amount is not a number, with the type it holds."""

    actual: Decimal
    children: int
    unreadable: tuple[tuple[Key, str], ...] = field(default=())


@dataclass(frozen=True)
class Verdict:
    """What is off about a parent. ``stored``: the value as read (an ``invalid_counter``'s
    is shown by type, never by value, where it is reported)."""

    kind: Kind
    attribute: str
    stored: Any
    actual: Any
    details: tuple[str, ...] = ()


def judge(
    rule: TallyRule,
    parent: ParentState,
    tally: ChildTotal,
    *,
    confirmations: int = 1,
    ttl_removed: bool = False,
) -> Verdict | None:
    """The verdict on one settled snapshot; None when the counter equals the truth (or
    neither parent nor children exist)."""
    details = []
    if confirmations == 2:
        details.append("no revision attribute: confirmed by two agreeing settled reads")
    if tally.unreadable:
        details.append(f"{len(tally.unreadable)} children hold a non-number and count 0")
    attribute = rule.counter
    if not parent.exists:
        if tally.children == 0:
            return None
        return Verdict("orphans", attribute, None, truth(Decimal(tally.children)), tuple(details))
    stored: Any = parent.counter
    actual: Any = tally.actual
    kind: Kind
    if not valid_counter(rule, stored):
        kind = "invalid_counter"
        problem = counter_problem(stored, whole=isinstance(rule, CountRule))
        details += [problem] if problem else []
    elif (stored if stored is not None else Decimal(0)) == actual:
        return None
    elif rule.revision and not valid_revision(parent.revision):
        # A repair bumps the revision: on a non-number it could never commit.
        kind, attribute, stored = "invalid_counter", rule.revision, parent.revision
        details.append(f"the revision attribute {rule.revision!r} is not a number")
    elif not representable(actual):
        kind, actual = "unrepresentable", str(actual)  # its exact digits, as text
        details.append("the children's sum needs more than 38 digits: no counter holds it")
    else:
        kind = "ttl_removal" if ttl_removed else "drift"
    return Verdict(kind, attribute, stored, truth(actual), tuple(details))


def drifted(rule: TallyRule, parent: ParentState, tally: ChildTotal) -> bool:
    """Whether a snapshot shows any finding at all (what two agreeing reads must confirm)."""
    return judge(rule, parent, tally) is not None


def valid_counter(rule: TallyRule | SequenceRule, value: Any, absent: Any = None) -> bool:
    """A counter the rule allows (a value a repair may write over): a finite number, whole
    and not negative unless the rule sums amounts; ``absent`` (the caller's marker for a
    missing attribute) reads as 0."""
    if value is absent:
        return True
    if not isinstance(value, Decimal) or not value.is_finite():
        return False
    if isinstance(rule, SumRule):
        return True
    return value >= 0 and value == value.to_integral_value()


def valid_revision(value: Any) -> bool:
    """Absent, or a number a repair's ADD 1 keeps within DynamoDB's domain."""
    return value is None or (representable(value) and representable(add(value, ONE)))


def truth(actual: Any) -> Any:
    """The truth as a finding shows it: a number as DynamoDB holds it, or (more digits than
    a counter holds) its exact digits as text."""
    if not isinstance(actual, Decimal):
        return actual
    return fit(actual) if representable(actual) else str(actual)
