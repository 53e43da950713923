"""Auto-increment numbers by the seeds' strategies, behind one ``allocate`` call.

- ``atomic`` (seeds 001, 003): ADD to the counter and take the new value, then put the
  member. Cheapest, but a crash between the two steps leaves a gap (the reconciler voids it).
- ``gapless`` (seed 000): consistent read of the counter, then one transaction of the counter
  update conditioned on the value read and the member put conditioned on absence.
- ``sortkey`` (seeds 001, 002): query the highest member, put the next one conditionally,
  retry with +1; the counter follows in the same transaction.
- ``block``: ``gapless`` for k consecutive numbers and their k members in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, cast

from botocore.exceptions import ClientError

from tally.dynamodb import (
    Backoff,
    Cancelled,
    Names,
    deserialize,
    serialize,
    transact,
)
from tally.rules import (
    CollectionMembers,
    IndexMembers,
    Key,
    PartitionMembers,
    RuleSet,
    SequenceRule,
)
from tally.writers.errors import CounterBehindError, InvalidCounterError
from tally.writers.transactions import number_or_none, retrying

Strategy = Literal["atomic", "gapless", "sortkey", "block"]
STRATEGIES: tuple[Strategy, ...] = ("atomic", "gapless", "sortkey", "block")
MAX_BLOCK = 99  # a transaction holds 100 items: the counter plus at most 99 members


@dataclass(frozen=True)
class Allocation:
    """Numbers handed out and the members written for them.

    ``already_present``: the natural-key member existed; ``numbers`` holds its number, and an
    ``atomic`` allocation burnt ``wasted`` (a gap the reconciler will void).
    """

    numbers: tuple[int, ...]
    member_keys: tuple[Key, ...]
    outcome: Literal["allocated", "already_present"] = "allocated"
    retries: int = 0
    wasted: tuple[int, ...] = field(default=())


class SequenceAllocator:
    """Hands out numbers for the sequence rules of a rules file."""

    def __init__(
        self, client: Any, table_name: str, rules: RuleSet, backoff: Backoff | None = None
    ):
        self.client = client
        self.table_name = table_name
        self.rules = rules
        self.backoff = backoff or Backoff()
        self._pk = rules.table.partition_key
        self._sk = rules.table.sort_key

    def allocate(
        self,
        counter_key: Mapping[str, str],
        *,
        strategy: Strategy = "gapless",
        count: int = 1,
        attributes: Mapping[str, Any] | None = None,
        member_key: Mapping[str, str] | None = None,
    ) -> Allocation:
        """Allocate ``count`` numbers (``block`` only; 1 otherwise) and write their members.

        No derived idempotency token here: two writers racing for the same number send
        identical transactions, and DynamoDB would answer the loser with the winner's
        success. botocore's own token still covers its retries of one attempt; a caller's
        retry is idempotent through a natural ``member_key``.
        """
        rule = self.rules.counter_match(counter_key).rule
        assert isinstance(rule, SequenceRule)
        key = dict(counter_key)
        self._check_request(rule, strategy, count, member_key)
        if member_key is not None:
            self.rules.validate_key(member_key)
        request = _Request(rule, key, count, dict(attributes or {}), member_key)
        if strategy == "atomic":
            return self._atomic(request)
        if strategy == "sortkey":
            return self._sortkey(request)
        return self._gapless(request)

    def _check_request(
        self, rule: SequenceRule, strategy: str, count: int, member_key: Mapping[str, str] | None
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"field 'strategy' must be one of {STRATEGIES}, got {strategy!r}")
        if strategy == "block":
            if not 1 <= count <= MAX_BLOCK:
                raise ValueError(f"field 'count' must be 1..{MAX_BLOCK} for a block, got {count}")
        elif count != 1:
            raise ValueError(f"field 'count' must be 1 for the {strategy} strategy, got {count}")
        if strategy == "sortkey" and isinstance(rule.members, PartitionMembers):
            raise ValueError(
                f"field 'strategy': 'sortkey' queries the counter's collection; rule "
                f"{rule.name!r} keeps each member in a partition of its own"
            )
        if isinstance(rule.members, IndexMembers):
            if member_key is None:
                raise ValueError(
                    f"field 'member_key' is required: rule {rule.name!r} members "
                    "are keyed by a natural key"
                )
            if strategy not in ("atomic", "gapless"):
                raise ValueError(
                    f"field 'strategy': {strategy!r} needs members in the counter's collection; "
                    f"rule {rule.name!r} finds them through {rule.members.index!r}"
                )
            if not any(
                m.role == "member" and m.rule is rule for m in self.rules.classify(member_key)
            ):
                raise ValueError(
                    f"field 'member_key': {dict(member_key)} is not a member of rule {rule.name!r}"
                )
        elif member_key is not None:
            raise ValueError(
                f"field 'member_key': rule {rule.name!r} derives member keys from the number"
            )

    # --- atomic -------------------------------------------------------------------------

    def _atomic(self, request: _Request) -> Allocation:
        rule = request.rule
        names = Names.of(rule.counter, rule.revision)
        adds = [f"{names[rule.counter]} :count"]
        values: dict[str, Any] = {":count": Decimal(request.count), ":number": "N"}
        if rule.revision:
            adds.append(f"{names[rule.revision]} :one")
            values[":one"] = Decimal(1)
        try:
            response = self.client.update_item(
                TableName=self.table_name,
                Key=self._key(request.counter_key),
                UpdateExpression="ADD " + ", ".join(adds),
                ConditionExpression=f"attribute_not_exists({names[rule.counter]}) OR "
                f"attribute_type({names[rule.counter]}, :number)",
                ExpressionAttributeNames=names.expression_names,
                ExpressionAttributeValues=serialize(values),
                ReturnValues="UPDATED_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            old = deserialize(_item_of(error))
            raise InvalidCounterError(
                request.counter_key, rule.counter, old.get(rule.counter)
            ) from None
        last = int(deserialize(response["Attributes"])[rule.counter])
        numbers = tuple(range(last - request.count + 1, last + 1))
        return self._put_members(request, numbers)

    def _put_members(self, request: _Request, numbers: tuple[int, ...]) -> Allocation:
        """Second step of ``atomic``; a crash before it ends leaves the numbers as gaps."""
        names = Names.of(self._pk)
        keys = []
        for number in numbers:
            member = self._member_item(request, number)
            try:
                self.client.put_item(
                    TableName=self.table_name,
                    Item=self._key(member),
                    ConditionExpression=f"attribute_not_exists({names[self._pk]})",
                    ExpressionAttributeNames=names.expression_names,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as error:
                if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
                existing = deserialize(_item_of(error))
                return self._existing(request, existing, number, wasted=numbers)
            keys.append(self.rules.key_of(member))
        return Allocation(numbers, tuple(keys))

    # --- gapless and block --------------------------------------------------------------

    def _gapless(self, request: _Request) -> Allocation:
        rule = request.rule
        current = self._read_counter(request)
        for attempt in retrying(self.backoff):
            numbers = tuple(range(current + 1, current + request.count + 1))
            members = [self._member_item(request, n) for n in numbers]
            names = Names.of(self._pk, rule.counter, rule.revision)
            counter = names[rule.counter]
            fenced = f"{counter} = :old" + (
                f" OR attribute_not_exists({counter})" if current == 0 else ""
            )
            values = {":old": Decimal(current), ":new": Decimal(numbers[-1])}
            items = [
                self._set_counter(request, names, ":new", fenced, values),
                *(self._put_absent(member, names) for member in members),
            ]
            try:
                transact(self.client, items, None, self.backoff)
            except Cancelled as cancelled:
                if cancelled.failed(0):
                    # Another writer moved the counter: its old image says where it is now.
                    current = self._counter_value(request, cancelled.old_item(0))
                    continue
                index = next(i for i in range(1, len(items)) if cancelled.failed(i))
                return self._collision(
                    request, cancelled.old_item(index) or {}, numbers[index - 1], attempt
                )
            return Allocation(
                numbers, tuple(self.rules.key_of(m) for m in members), retries=attempt - 1
            )
        raise RuntimeError(
            f"counter {request.counter_key} stayed contended for {self.backoff.rounds} rounds"
        )

    # --- sort key -----------------------------------------------------------------------

    def _sortkey(self, request: _Request) -> Allocation:
        rule = request.rule
        number = self._highest_member(request) + 1
        for attempt in retrying(self.backoff):
            member = self._member_item(request, number)
            names = Names.of(self._pk, rule.counter, rule.revision)
            counter = names[rule.counter]
            below = f"attribute_not_exists({counter}) OR {counter} < :n"
            items = [
                self._put_absent(member, names),
                self._set_counter(request, names, ":n", below, {":n": Decimal(number)}),
            ]
            try:
                transact(self.client, items, None, self.backoff)
            except Cancelled as cancelled:
                if cancelled.failed(0):
                    number += 1  # lost the race for this number: try the next (seed 001)
                else:
                    # The counter is already past it: numbers up to the counter are claimed.
                    number = self._counter_value(request, cancelled.old_item(1)) + 1
                continue
            return Allocation((number,), (self.rules.key_of(member),), retries=attempt - 1)
        raise RuntimeError(
            f"sequence {request.counter_key} stayed contended for {self.backoff.rounds} rounds"
        )

    def _highest_member(self, request: _Request) -> int:
        members = request.rule.members
        assert isinstance(members, CollectionMembers) and self._sk is not None
        names = Names.of(self._pk, self._sk)
        span = request.rule.member_pattern(self.rules.table)[self._sk]
        # Members of a number sort key are the positive numbers; of a string one, the prefix.
        condition = "{} > :start" if span.numeric else "begins_with({}, :start)"
        counter = self.rules.table.typed(request.counter_key)
        response = self.client.query(
            TableName=self.table_name,
            KeyConditionExpression=(
                f"{names[self._pk]} = :pk AND " + condition.format(names[self._sk])
            ),
            ExpressionAttributeNames=names.expression_names,
            ExpressionAttributeValues=serialize(
                {":pk": counter[self._pk], ":start": Decimal(0) if span.numeric else span.value}
            ),
            ScanIndexForward=False,
            ConsistentRead=True,
            ProjectionExpression=names[self._sk],
        )
        for item in response["Items"]:
            number = request.rule.member_number(deserialize(item)[self._sk])
            if number is not None:
                return number
        return 0

    # --- shared -------------------------------------------------------------------------

    def _key(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """The item (or key) serialized, number key attributes as numbers."""
        return serialize(self.rules.table.typed(item))

    def _read_counter(self, request: _Request) -> int:
        names = Names.of(request.rule.counter)
        response = self.client.get_item(
            TableName=self.table_name,
            Key=self._key(request.counter_key),
            ConsistentRead=True,
            ProjectionExpression=names[request.rule.counter],
            ExpressionAttributeNames=names.expression_names,
        )
        item = deserialize(response["Item"]) if "Item" in response else None
        return self._counter_value(request, item)

    def _counter_value(self, request: _Request, item: Mapping[str, Any] | None) -> int:
        value = number_or_none(item, request.rule.counter, request.counter_key)
        if value is None:
            return 0
        if value != int(value) or value < 0:
            raise InvalidCounterError(request.counter_key, request.rule.counter, value)
        return int(value)

    def _member_item(self, request: _Request, number: int) -> dict[str, Any]:
        rule, members = request.rule, request.rule.members
        if isinstance(members, IndexMembers):
            assert request.member_key is not None
            extra = {
                members.number: Decimal(number),
                members.sequence_attribute: rule.sequence_name,
            }
            return {**request.attributes, **extra, **request.member_key}
        return {
            **request.attributes,
            **rule.member_key(request.counter_key, number, self.rules.table),
        }

    def _set_counter(
        self,
        request: _Request,
        names: Names,
        value: str,
        condition: str,
        values: dict[str, Any],
    ) -> dict[str, Any]:
        """The counter's conditional SET (and revision bump) for a transaction."""
        rule = request.rule
        update = f"SET {names[rule.counter]} = {value}"
        if rule.revision:
            update += f" ADD {names[rule.revision]} :one"
            values = values | {":one": Decimal(1)}
        return {
            "Update": {
                "TableName": self.table_name,
                "Key": self._key(request.counter_key),
                "UpdateExpression": update,
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names.subset(rule.counter, rule.revision),
                "ExpressionAttributeValues": serialize(values),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def _put_absent(self, member: Mapping[str, Any], names: Names) -> dict[str, Any]:
        return {
            "Put": {
                "TableName": self.table_name,
                "Item": self._key(member),
                "ConditionExpression": f"attribute_not_exists({names[self._pk]})",
                "ExpressionAttributeNames": names.subset(self._pk),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def _collision(
        self, request: _Request, existing: Mapping[str, Any], number: int, attempt: int
    ) -> Allocation:
        """A member's put failed: a natural key already taken, or a counter behind members."""
        if isinstance(request.rule.members, IndexMembers):
            return self._existing(request, existing, number, wasted=(), retries=attempt - 1)
        raise CounterBehindError(request.counter_key, number)

    def _existing(
        self,
        request: _Request,
        existing: Mapping[str, Any],
        number: int,
        wasted: tuple[int, ...],
        retries: int = 0,
    ) -> Allocation:
        members = request.rule.members
        if not isinstance(members, IndexMembers):
            raise CounterBehindError(request.counter_key, number)
        held = existing.get(members.number)
        numbers = (int(held),) if isinstance(held, Decimal) else ()
        key = self.rules.key_of(existing) if existing else dict(request.member_key or {})
        return Allocation(numbers, (key,), "already_present", retries, wasted)


@dataclass(frozen=True)
class _Request:
    rule: SequenceRule
    counter_key: Key
    count: int
    attributes: dict[str, Any]
    member_key: Mapping[str, str] | None


def _item_of(error: ClientError) -> dict[str, Any]:
    """The item a failed condition returned (ALL_OLD), serialized."""
    return cast(dict[str, Any], error.response.get("Item") or {})
