"""The main table as the reconciler sees it: settled reads, recounts and fenced repairs.

Every read here is strongly consistent (GSI queries excepted: DynamoDB offers none), and
every write is conditioned on the exact state that was verified, carries the repair
marker, and goes in one transaction with the audit-table items the caller passes (the
repair log, the marker's record, the alert), so none of them can exist without the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tally.dynamodb import (
    Backoff,
    Cancelled,
    Names,
    deserialize,
    serialize,
    transact,
)
from tally.numbers import NULL, add, number
from tally.rules import (
    REPAIR_MARKER,
    AttributeMembers,
    CollectionMembers,
    CountRule,
    IndexMembers,
    Key,
    PartitionMembers,
    RuleSet,
    SequenceRule,
    SumRule,
)

AnyRule = CountRule | SumRule | SequenceRule
_ABSENT = None
_BATCH_GET = 100  # BatchGetItem's limit of keys per request


@dataclass(frozen=True)
class ParentState:
    """A parent's (or sequence counter's) counter and revision, as one consistent read saw them."""

    exists: bool
    counter: Any = _ABSENT
    revision: Any = _ABSENT

    def same_as(self, other: ParentState) -> bool:
        return (self.exists, self.counter, self.revision) == (
            other.exists,
            other.counter,
            other.revision,
        )


@dataclass
class Reads:
    """What verification cost: items read and read capacity consumed."""

    items: int = 0
    capacity: Decimal = Decimal(0)
    recounts: int = 0

    def add(self, response: Mapping[str, Any], items: int) -> None:
        self.items += items
        consumed = response.get("ConsumedCapacity") or {}
        self.capacity += Decimal(str(consumed.get("CapacityUnits", 0)))


@dataclass(frozen=True)
class Tally:
    """The truth counted from the children (an exact sum, which may need more digits than a
    counter holds), and children whose amount is not a number, with the type it holds."""

    actual: Decimal
    children: int
    unreadable: tuple[tuple[Key, str], ...] = field(default=())


class TallyTable:
    """Reads and repairs on the main table for the reconciler."""

    def __init__(
        self, client: Any, table_name: str, rules: RuleSet, backoff: Backoff | None = None
    ):
        self.client = client
        self.name = table_name
        self.rules = rules
        self.reads = Reads()
        self.backoff = backoff or Backoff()
        self._pk = rules.table.partition_key
        self._sk = rules.table.sort_key

    # --- reads --------------------------------------------------------------------------

    def read_parent(self, rule: AnyRule, key: Key) -> ParentState:
        names = Names.of(rule.counter, rule.revision, self._pk)
        response = self.client.get_item(
            TableName=self.name,
            Key=self._key(key),
            ConsistentRead=True,
            ProjectionExpression=", ".join(
                names[a] for a in (self._pk, rule.counter, rule.revision) if a
            ),
            ExpressionAttributeNames=names.expression_names,
            ReturnConsumedCapacity="TOTAL",
        )
        item = deserialize(response["Item"]) if "Item" in response else None
        self.reads.add(response, 1 if item else 0)
        if item is None:
            return ParentState(False)
        revision = item.get(rule.revision) if rule.revision else _ABSENT
        if revision is None and rule.revision in item:
            revision = NULL  # a NULL revision is no absent one: no repair can bump it
        return ParentState(True, item.get(rule.counter, _ABSENT), revision)

    def tally_children(self, rule: CountRule | SumRule, parent_key: Key) -> Tally:
        """Count or sum the children with paginated consistent queries."""
        self.reads.recounts += 1
        assert self._sk is not None
        names = Names.of(self._pk, self._sk, rule.summed if isinstance(rule, SumRule) else None)
        span = rule.children_pattern(self.rules.table)
        # Children share the parent's partition: a prefix of a string sort key, or (number
        # sort key) every positive number.
        condition = "{} > :start" if span.numeric else "begins_with({}, :start)"
        start = Decimal(0) if span.numeric else span.value
        request: dict[str, Any] = {
            "TableName": self.name,
            "KeyConditionExpression": (
                f"{names[self._pk]} = :pk AND " + condition.format(names[self._sk])
            ),
            "ExpressionAttributeValues": serialize(
                {":pk": self._value(parent_key, self._pk), ":start": start}
            ),
            "ConsistentRead": True,
            "ReturnConsumedCapacity": "TOTAL",
        }
        if isinstance(rule, SumRule):
            request["ProjectionExpression"] = ", ".join(names.mapping.values())
            request["ExpressionAttributeNames"] = names.expression_names
        else:
            request["Select"] = "COUNT"  # the count alone: no item is returned
            request["ExpressionAttributeNames"] = names.subset(self._pk, self._sk)
        total, children, unreadable = Decimal(0), 0, []
        for page in self.client.get_paginator("query").paginate(**request):
            self.reads.add(page, page["ScannedCount"])
            children += page["Count"]
            if isinstance(rule, SumRule):
                for raw in page["Items"]:
                    item = deserialize(raw)
                    amount = number(item.get(rule.summed, Decimal(0)))
                    if isinstance(amount, Decimal):
                        total = add(total, amount)
                    else:
                        unreadable.append((self.rules.key_of(item), amount))
        actual = total if isinstance(rule, SumRule) else Decimal(children)
        return Tally(actual, children, tuple(unreadable))

    def member_numbers(
        self, rule: SequenceRule, counter_key: Key, above: int
    ) -> list[tuple[int, Key]]:
        """Members numbered above ``above``, ascending (the GSI is eventually consistent)."""
        if isinstance(rule.members, CollectionMembers):
            return self._collection_members(rule, rule.members, counter_key, above)
        if isinstance(rule.members, PartitionMembers):
            return self._partition_members(rule, counter_key, above)
        if isinstance(rule.members, AttributeMembers):
            raise ValueError(f"rule {rule.name!r}: attribute-layout members are in the ledger")
        return self._index_members(rule, rule.members, above)

    def attribute_number(self, rule: SequenceRule, member: Key) -> int | None:
        """The ordinal a member holds now (attribute layout), by a consistent read."""
        assert isinstance(rule.members, AttributeMembers)
        names = Names.of(rule.members.number)
        response = self.client.get_item(
            TableName=self.name,
            Key=self._key(member),
            ConsistentRead=True,
            ProjectionExpression=names[rule.members.number],
            ExpressionAttributeNames=names.expression_names,
            ReturnConsumedCapacity="TOTAL",
        )
        item = deserialize(response["Item"]) if "Item" in response else {}
        self.reads.add(response, 1 if item else 0)
        return rule.attribute_number(item.get(rule.members.number))

    def _collection_members(
        self, rule: SequenceRule, members: CollectionMembers, counter_key: Key, above: int
    ) -> list[tuple[int, Key]]:
        assert self._sk is not None
        names = Names.of(self._pk, self._sk)
        values: dict[str, Any] = {":pk": self._value(counter_key, self._pk)}
        if self.rules.table.numeric(self._sk):
            condition = f"{names[self._sk]} > :above"
            values[":above"] = Decimal(above)
        else:
            condition = f"{names[self._sk]} BETWEEN :start AND :end"
            values[":start"] = members.prefix + str(above + 1).zfill(members.width)
            values[":end"] = members.prefix + "\U0010ffff"
        found = []
        pages = self.client.get_paginator("query").paginate(
            TableName=self.name,
            KeyConditionExpression=f"{names[self._pk]} = :pk AND {condition}",
            ExpressionAttributeNames=names.expression_names,
            ExpressionAttributeValues=serialize(values),
            ProjectionExpression=", ".join(names.mapping.values()),
            ConsistentRead=True,
            ReturnConsumedCapacity="TOTAL",
        )
        for page in pages:
            self.reads.add(page, page["ScannedCount"])
            for raw in page["Items"]:
                key = self.rules.key_of(deserialize(raw))
                number = rule.member_number(key[self._sk])
                if number is not None and number > above:
                    found.append((number, key))
        return found

    def _partition_members(
        self, rule: SequenceRule, counter_key: Key, above: int
    ) -> list[tuple[int, Key]]:
        """Members above ``above`` by consistent point reads, each in its own partition.

        Numbers up to the counter are read, then on past it for as long as a hundred
        numbers hold a member: a writer ahead of its counter shows, far strays do not.
        """
        counter = self.read_parent(rule, counter_key).counter
        counted = isinstance(counter, Decimal) and counter.is_finite() and counter > 0
        through = int(counter) if counted else 0
        found: list[tuple[int, Key]] = []
        number, beyond = above + 1, True
        while number <= through or beyond:
            numbers = range(number, number + _BATCH_GET)
            hits = self._get_members(rule, counter_key, numbers)
            found += hits
            beyond = any(n > through for n, _ in hits)
            number += _BATCH_GET
        return sorted(found)

    def _get_members(
        self, rule: SequenceRule, counter_key: Key, numbers: range
    ) -> list[tuple[int, Key]]:
        table = self.rules.table
        names = Names.of(*table.names)
        request = {
            "Keys": [self._key(rule.member_key(counter_key, n, table)) for n in numbers],
            "ConsistentRead": True,
            "ProjectionExpression": ", ".join(names.mapping.values()),
            "ExpressionAttributeNames": names.expression_names,
        }
        found = []
        for attempt in range(self.backoff.attempts):
            response = self.client.batch_get_item(
                RequestItems={self.name: request}, ReturnConsumedCapacity="TOTAL"
            )
            items = response["Responses"].get(self.name, [])
            consumed = response.get("ConsumedCapacity") or [{}]  # one entry: one table
            self.reads.add({"ConsumedCapacity": consumed[0]}, len(items))
            for raw in items:
                key = self.rules.key_of(deserialize(raw))
                member = rule.member_number(key[table.partition_key])
                if member is not None:
                    found.append((member, key))
            unprocessed = response.get("UnprocessedKeys", {}).get(self.name)
            if not unprocessed:
                return found
            request = unprocessed  # throttled keys come back to be asked again
            self.backoff.pause(attempt)
        raise RuntimeError(
            f"{self.name}: keys still unprocessed after {self.backoff.attempts} tries"
        )

    def _index_members(
        self, rule: SequenceRule, members: IndexMembers, above: int
    ) -> list[tuple[int, Key]]:
        names = Names.of(members.sequence_attribute, members.number)
        found = []
        pages = self.client.get_paginator("query").paginate(
            TableName=self.name,
            IndexName=members.index,
            KeyConditionExpression=(
                f"{names[members.sequence_attribute]} = :seq AND {names[members.number]} > :above"
            ),
            ExpressionAttributeNames=names.expression_names,
            ExpressionAttributeValues=serialize(
                {":seq": rule.sequence_name, ":above": Decimal(above)}
            ),
            ReturnConsumedCapacity="TOTAL",
        )
        for page in pages:
            self.reads.add(page, page["ScannedCount"])
            for raw in page["Items"]:
                item = deserialize(raw)
                number = item[members.number]
                key = self.rules.key_of(item)
                if self._is_member(rule, key) and number.is_finite() and number == int(number):
                    found.append((int(number), key))
        return found

    def _is_member(self, rule: SequenceRule, key: Key) -> bool:
        """Only items the rule's member pattern claims count, whatever attributes others carry."""
        return any(m.rule is rule and m.role == "member" for m in self.rules.classify(key))

    # --- fenced writes -----------------------------------------------------------------

    def set_counter(
        self,
        rule: AnyRule,
        key: Key,
        verified: ParentState,
        value: Decimal,
        marker: str,
        logged: Sequence[Mapping[str, Any]],
    ) -> bool:
        """SET counter = value, only if counter and revision still hold what was verified."""
        names = Names.of(rule.counter, rule.revision, REPAIR_MARKER)
        fences = [_fence(names[rule.counter], ":stored", verified.counter)]
        values: dict[str, Any] = {":value": value, ":marker": marker}
        if verified.counter is not _ABSENT:
            values[":stored"] = verified.counter
        update = f"SET {names[rule.counter]} = :value, {names[REPAIR_MARKER]} = :marker"
        if rule.revision:
            fences.append(_fence(names[rule.revision], ":revision", verified.revision))
            if verified.revision is not _ABSENT:
                values[":revision"] = verified.revision
            update += f" ADD {names[rule.revision]} :one"
            values[":one"] = Decimal(1)
        item = {
            "Update": {
                "TableName": self.name,
                "Key": self._key(key),
                "UpdateExpression": update,
                "ConditionExpression": " AND ".join(f"({f})" for f in fences),
                "ExpressionAttributeNames": names.expression_names,
                "ExpressionAttributeValues": serialize(values),
            }
        }
        return self._fenced([item, *logged])

    def decrement(
        self,
        rule: CountRule | SumRule,
        key: Key,
        delta: Decimal,
        marker: str,
        marker_put: Mapping[str, Any],
    ) -> bool:
        """Apply a TTL expiry's decrement once: the marker put fails on redelivery."""
        names = Names.of(self._pk, rule.counter, rule.revision, REPAIR_MARKER)
        adds = [f"{names[rule.counter]} :delta"] + (
            [f"{names[rule.revision]} :one"] if rule.revision else []
        )
        item = {
            "Update": {
                "TableName": self.name,
                "Key": self._key(key),
                "UpdateExpression": f"SET {names[REPAIR_MARKER]} = :marker ADD " + ", ".join(adds),
                "ConditionExpression": f"attribute_exists({names[self._pk]})",
                "ExpressionAttributeNames": names.expression_names,
                "ExpressionAttributeValues": serialize(
                    {":delta": -delta, ":marker": marker}
                    | ({":one": Decimal(1)} if rule.revision else {})
                ),
            }
        }
        return self._fenced([item, marker_put])

    def put_void(
        self,
        rule: SequenceRule,
        counter_key: Key,
        number: int,
        marker: str,
        logged: Sequence[Mapping[str, Any]],
    ) -> bool:
        """A VOID tombstone for a missing number, only where no member exists."""
        item: dict[str, Any] = {"void": True, REPAIR_MARKER: marker}
        item |= self.rules.table.typed(self.void_key(rule, counter_key, number))
        if isinstance(rule.members, IndexMembers):
            item |= {
                rule.members.sequence_attribute: rule.sequence_name,
                rule.members.number: Decimal(number),
            }
        names = Names.of(self._pk)
        put = {
            "Put": {
                "TableName": self.name,
                "Item": serialize(item),
                "ConditionExpression": f"attribute_not_exists({names[self._pk]})",
                "ExpressionAttributeNames": names.expression_names,
            }
        }
        return self._fenced([put, *logged])

    def _index_void_key(self, rule: SequenceRule, members: IndexMembers, number: int) -> Key:
        pattern = members.key
        key = {}
        for name in self.rules.table.names:
            value = pattern.get(name)
            if value is None:
                key[name] = "VOID"
            elif value.endswith("*"):
                key[name] = f"{value[:-1]}VOID#{rule.name}#{number:010d}"
            else:
                key[name] = value
        return key

    def _key(self, key: Key) -> dict[str, Any]:
        return serialize(self.rules.table.typed(key))

    def _value(self, key: Key, attribute: str) -> Any:
        return self.rules.table.typed(key)[attribute]

    def void_key(self, rule: SequenceRule, counter_key: Key, number: int) -> Key:
        """The key a VOID tombstone for ``number`` is written at."""
        if not isinstance(rule.members, IndexMembers):
            return rule.member_key(counter_key, number, self.rules.table)
        return self._index_void_key(rule, rule.members, number)

    def _fenced(self, items: list[Any]) -> bool:
        # No derived token: botocore's own token makes its retries idempotent, and each
        # repair's items (its marker, its log) are unique, so a new repair is never a replay.
        try:
            transact(self.client, items, None, self.backoff)
        except Cancelled:
            return False
        return True


def _fence(name: str, placeholder: str, verified: Any) -> str:
    if verified is _ABSENT:
        return f"attribute_not_exists({name})"
    return f"{name} = {placeholder}"
