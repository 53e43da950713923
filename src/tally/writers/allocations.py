"""What one allocation asks for, checked whole before its first write."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, cast

import tally.writers.items as items
from tally.rules import (
    AttributeMembers,
    IndexMembers,
    Key,
    PartitionMembers,
    RuleSet,
    SequenceRule,
    TableKeys,
)
from tally.writers.errors import InvalidRequestError
from tally.writers.idempotency import Keyed
from tally.writers.reserved import refuse_reserved, reserved_attributes

Strategy = Literal["atomic", "gapless", "sortkey", "block"]
STRATEGIES: tuple[Strategy, ...] = ("atomic", "gapless", "sortkey", "block")
# A transaction holds 100 items: the counter, an idempotency guard and at most 98 members.
MAX_BLOCK = 98
_WIDEST = 10**items.MAX_DIGITS - 1  # sizes are checked with the longest number there can be
_TRANSACTION_OVERHEAD = 2048  # the counter update, expression names and values


@dataclass(frozen=True)
class AllocationRequest:
    """A checked allocation: its rule, counter, size, member attributes and natural key."""

    rule: SequenceRule
    counter_key: Key
    count: int
    attributes: dict[str, Any]
    member_key: Key | None
    keyed: Keyed | None = None

    def member(self, table: TableKeys, number: int) -> dict[str, Any]:
        """The member item for ``number``."""
        members = self.rule.members
        if isinstance(members, IndexMembers):
            assert self.member_key is not None
            extra = {
                members.number: Decimal(number),
                members.sequence_attribute: self.rule.sequence_name,
            }
            return {**self.attributes, **extra, **self.member_key}
        return {**self.attributes, **self.rule.member_key(self.counter_key, number, table)}


def allocation_request(
    rules: RuleSet,
    counter_key: Mapping[str, str],
    strategy: str,
    count: int,
    attributes: Mapping[str, Any],
    member_key: Mapping[str, str] | None,
) -> AllocationRequest:
    """The request, or ``InvalidRequestError`` naming the first field DynamoDB or the rules
    would refuse; members are sized with the widest number they could get."""
    try:
        rule = rules.counter_match(counter_key).rule
    except ValueError as error:
        raise InvalidRequestError(("counter",), str(error)) from None
    assert isinstance(rule, SequenceRule)
    items.check_key(counter_key, rules.table, ("counter",))
    _check_shape(rules, rule, strategy, count, member_key)
    values = items.attributes(attributes, ("attributes",))
    refuse_reserved(values, reserved_attributes(rules, rule), ("attributes",))
    key = dict(member_key) if member_key is not None else None
    request = AllocationRequest(rule, dict(counter_key), count, values, key)
    widest = request.member(rules.table, _WIDEST)
    items.check_key(widest, rules.table, ("member_key" if key else "counter",))
    size = items.check_size(widest, ("attributes",))
    if count > 1:
        # The guard repeats each member's key; the counter update rides along.
        key_size = items.item_size(rules.key_of(widest))
        total = count * (size + key_size + 32) + _TRANSACTION_OVERHEAD
        if total > items.MAX_TRANSACTION_BYTES:
            raise InvalidRequestError(
                ("count",),
                f"{count} members of {size} bytes exceed the "
                f"{items.MAX_TRANSACTION_BYTES} bytes one transaction may write",
            )
    return request


def _check_shape(
    rules: RuleSet,
    rule: SequenceRule,
    strategy: str,
    count: int,
    member_key: Mapping[str, str] | None,
) -> None:
    if strategy not in STRATEGIES:
        raise InvalidRequestError(("strategy",), f"must be one of {STRATEGIES}, got {strategy!r}")
    if rule.counter_holds != "last" or isinstance(rule.members, AttributeMembers):
        raise InvalidRequestError(
            ("rule",), f"rule {rule.name!r} verifies a foreign writer's sequence: allocate there"
        )
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidRequestError(("count",), f"must be an integer, got {count!r}")
    if strategy == "block":
        if not 1 <= count <= MAX_BLOCK:
            raise InvalidRequestError(
                ("count",), f"must be 1..{MAX_BLOCK} for a block, got {count}"
            )
    elif count != 1:
        raise InvalidRequestError(("count",), f"must be 1 for the {strategy} strategy, got {count}")
    if strategy == "sortkey" and isinstance(rule.members, PartitionMembers):
        raise InvalidRequestError(
            ("strategy",),
            f"'sortkey' queries the counter's collection; rule {rule.name!r} keeps each "
            "member in a partition of its own",
        )
    if isinstance(rule.members, IndexMembers):
        _check_natural_key(rules, rule, strategy, member_key)
    elif member_key is not None:
        raise InvalidRequestError(
            ("member_key",), f"rule {rule.name!r} derives member keys from the number"
        )


def _check_natural_key(
    rules: RuleSet, rule: SequenceRule, strategy: str, member_key: Mapping[str, str] | None
) -> None:
    field = ("member_key",)
    if member_key is None:
        raise InvalidRequestError(
            field, f"is required: rule {rule.name!r} members are keyed by a natural key"
        )
    if strategy not in ("atomic", "gapless"):
        index = cast(IndexMembers, rule.members).index
        raise InvalidRequestError(
            ("strategy",),
            f"{strategy!r} needs members in the counter's collection; "
            f"rule {rule.name!r} finds them through {index!r}",
        )
    try:
        rules.validate_key(member_key)
    except ValueError as error:
        raise InvalidRequestError(field, str(error)) from None
    if not any(m.role == "member" and m.rule is rule for m in rules.classify(member_key)):
        raise InvalidRequestError(
            field, f"{dict(member_key)} is not a member of rule {rule.name!r}"
        )
