"""The main table as the reconciler sees it: settled reads, recounts and fenced repairs.

Every read here is strongly consistent (GSI queries excepted: DynamoDB offers none), and
every write is conditioned on the exact state that was verified, carries the repair
marker, and goes in one transaction with the audit-table items the caller passes (the
repair log, the marker's record, the alert), so none of them can exist without the other.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from tally.core.dynamodb import (
    Backoff,
    Cancelled,
    Names,
    deserialize,
    serialize,
    transact,
)
from tally.core.numbers import NULL, add, number
from tally.reconciler.protocol.judgement import ParentState, Tally
from tally.rules import (
    REPAIR_MARKER,
    AnyRule,
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

VoidOutcome = Literal["written", "arrived", "gone"]
DecrementOutcome = Literal["applied", "replayed", "refused"]
# A member as read: its number, its key, and whether it is a VOID tombstone.
Member = tuple[int, Key, bool]
VOID = "void"  # the attribute that marks a tombstone
_ABSENT = None
_BATCH_GET = 100  # BatchGetItem's limit of keys per request


@dataclass
class Reads:
    """What verification cost: items read and read capacity consumed."""

    items: int = 0
    capacity: Decimal = Decimal(0)
    recounts: int = 0
    # Item collections are verified concurrently: each total moves under this lock.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, response: Mapping[str, Any], items: int) -> None:
        consumed = response.get("ConsumedCapacity") or {}
        with self._lock:
            self.items += items
            self.capacity += Decimal(str(consumed.get("CapacityUnits", 0)))

    def recounted(self) -> None:
        with self._lock:
            self.recounts += 1


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
        self.reads.recounted()
        request = self._children_request(rule, parent_key)
        names = Names.of(self._pk, self._sk, rule.summed if isinstance(rule, SumRule) else None)
        if isinstance(rule, SumRule):
            request["ProjectionExpression"] = ", ".join(names.mapping.values())
            request["ExpressionAttributeNames"] = names.expression_names
        else:
            request["Select"] = "COUNT"  # the count alone: no item is returned
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

    def has_more_children(self, rule: CountRule | SumRule, parent_key: Key, than: int) -> bool:
        """Does the parent have more than ``than`` children? One ``Select=COUNT`` query of at
        most ``than + 1`` children (about 1 RCU for small ones), not a recount."""
        request = self._children_request(rule, parent_key)
        request |= {"Select": "COUNT", "Limit": than + 1, "ConsistentRead": False}
        response = self.client.query(**request)
        self.reads.add(response, response["ScannedCount"])
        return response["Count"] > than or "LastEvaluatedKey" in response

    def _children_request(self, rule: CountRule | SumRule, parent_key: Key) -> dict[str, Any]:
        """A consistent query of the parent's children: they share its partition, under a
        prefix of a string sort key, or (number sort key) at every positive number."""
        assert self._sk is not None
        names = Names.of(self._pk, self._sk)
        span = rule.children_pattern(self.rules.table)
        condition = "{} > :start" if span.numeric else "begins_with({}, :start)"
        start = Decimal(0) if span.numeric else span.value
        return {
            "TableName": self.name,
            "KeyConditionExpression": (
                f"{names[self._pk]} = :pk AND " + condition.format(names[self._sk])
            ),
            "ExpressionAttributeNames": names.expression_names,
            "ExpressionAttributeValues": serialize(
                {":pk": self._value(parent_key, self._pk), ":start": start}
            ),
            "ConsistentRead": True,
            "ReturnConsumedCapacity": "TOTAL",
        }

    def member_numbers(
        self, rule: SequenceRule, counter_key: Key, above: int, *, voids: bool = True
    ) -> list[tuple[int, Key]]:
        """Members numbered above ``above``, ascending (the GSI is eventually consistent).

        VOID tombstones hold their numbers like members; ``voids=False`` leaves them out,
        for the question whether any real member is left.
        """
        if isinstance(rule.members, CollectionMembers):
            found = self._collection_members(rule, rule.members, counter_key, above)
        elif isinstance(rule.members, PartitionMembers):
            found = self._partition_members(rule, counter_key, above)
        elif isinstance(rule.members, AttributeMembers):
            raise ValueError(f"rule {rule.name!r}: attribute-layout members are in the ledger")
        else:
            found = self._index_members(rule, rule.members, above)
        return [(n, key) for n, key, void in found if voids or not void]

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
    ) -> list[Member]:
        assert self._sk is not None
        names = Names.of(self._pk, self._sk, VOID)
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
                item = deserialize(raw)
                key = self.rules.key_of(item)
                number = rule.member_number(key[self._sk])
                if number is not None and number > above:
                    found.append((number, key, item.get(VOID) is True))
        return found

    def _partition_members(self, rule: SequenceRule, counter_key: Key, above: int) -> list[Member]:
        """Members above ``above`` by consistent point reads, each in its own partition.

        Numbers up to the counter are read, then on past it for as long as a hundred
        numbers hold a member: a writer ahead of its counter shows, far strays do not.
        """
        counter = self.read_parent(rule, counter_key).counter
        counted = isinstance(counter, Decimal) and counter.is_finite() and counter > 0
        through = int(counter) if counted else 0
        found: list[Member] = []
        number, beyond = above + 1, True
        while number <= through or beyond:
            numbers = range(number, number + _BATCH_GET)
            hits = self._get_members(rule, counter_key, numbers)
            found += hits
            beyond = any(n > through for n, _, _ in hits)
            number += _BATCH_GET
        return sorted(found)

    def _get_members(self, rule: SequenceRule, counter_key: Key, numbers: range) -> list[Member]:
        table = self.rules.table
        names = Names.of(*table.names, VOID)
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
                item = deserialize(raw)
                key = self.rules.key_of(item)
                member = rule.member_number(key[table.partition_key])
                if member is not None:
                    found.append((member, key, item.get(VOID) is True))
            unprocessed = response.get("UnprocessedKeys", {}).get(self.name)
            if not unprocessed:
                return found
            request = unprocessed  # throttled keys come back to be asked again
            self.backoff.pause(attempt)
        raise RuntimeError(
            f"{self.name}: keys still unprocessed after {self.backoff.attempts} tries"
        )

    def _index_members(self, rule: SequenceRule, members: IndexMembers, above: int) -> list[Member]:
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
                    void = key == self._index_void_key(rule, members, int(number))
                    found.append((int(number), key, void))
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
        """SET counter = value, only if the parent still exists with the counter and revision
        that were verified: a repair never creates a parent, nor writes over a non-number."""
        if not verified.exists or not _number_or_absent(verified.counter):
            raise ValueError(f"{rule.name}: a repair writes only over a number it has judged")
        names = Names.of(self._pk, rule.counter, rule.revision, REPAIR_MARKER)
        fences = [
            f"attribute_exists({names[self._pk]})",
            _fence(names[rule.counter], ":stored", verified.counter),
        ]
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
    ) -> DecrementOutcome:
        """Apply a TTL expiry's decrement once: the marker put fails on redelivery.

        "applied", "replayed" (applied before: a redelivery), or "refused": the parent is
        gone, its counter holds no number, or (count rules) it is below the decrement, as
        on a parent deleted and made again since the child expired. Then nothing is
        written and the expiry is the recount's to judge.
        """
        names = Names.of(self._pk, rule.counter, rule.revision, REPAIR_MARKER)
        condition = f"attribute_exists({names[self._pk]})"
        if isinstance(rule, CountRule):
            condition += f" AND {names[rule.counter]} >= :floor"
        else:
            condition += f" AND attribute_type({names[rule.counter]}, :number)"
        if rule.revision:  # ADD on a revision holding text would fail the transaction
            revision = names[rule.revision]
            condition += (
                f" AND (attribute_not_exists({revision}) OR attribute_type({revision}, :n))"
            )
        adds = [f"{names[rule.counter]} :delta"] + (
            [f"{names[rule.revision]} :one"] if rule.revision else []
        )
        item = {
            "Update": {
                "TableName": self.name,
                "Key": self._key(key),
                "UpdateExpression": f"SET {names[REPAIR_MARKER]} = :marker ADD " + ", ".join(adds),
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names.expression_names,
                "ExpressionAttributeValues": serialize(
                    {":delta": -delta, ":marker": marker}
                    | ({":one": Decimal(1)} if rule.revision else {})
                    | ({":floor": delta} if isinstance(rule, CountRule) else {":number": "N"})
                    | ({":n": "N"} if rule.revision else {})
                ),
            }
        }
        try:
            transact(self.client, [item, marker_put], None, self.backoff)
        except Cancelled as cancelled:
            return "replayed" if cancelled.failed(1) else "refused"
        return "applied"

    def put_void(
        self,
        rule: SequenceRule,
        counter_key: Key,
        number: int,
        anchor: Key,
        marker: str,
        logged: Sequence[Mapping[str, Any]],
    ) -> VoidOutcome:
        """A VOID tombstone for a missing number, only where no member exists, and only while
        the sequence stands: its counter item exists and handed the number out (``anchor`` is
        the counter's key), or, without a counter, the member at ``anchor`` still exists.

        "written", "arrived" (a member holds the number after all) or "gone" (the sequence
        is not there any more: nothing may be written under it).
        """
        item: dict[str, Any] = {VOID: True, REPAIR_MARKER: marker}
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
        stands = self._sequence_stands(rule, anchor, number)
        try:
            transact(self.client, [put, stands, *logged], None, self.backoff)
        except Cancelled as cancelled:
            return "gone" if cancelled.failed(1) else "arrived"
        return "written"

    def _sequence_stands(self, rule: SequenceRule, anchor: Key, number: int) -> dict[str, Any]:
        """The condition that the sequence still exists: its counter handed ``number`` out,
        or (members only) its member at ``anchor`` is still there."""
        names = Names.of(self._pk, rule.counter if rule.has_counter else None)
        condition = f"attribute_exists({names[self._pk]})"
        check: dict[str, Any] = {
            "TableName": self.name,
            "Key": self._key(anchor),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names.expression_names,
        }
        if rule.has_counter:
            check["ConditionExpression"] += f" AND {names[rule.counter]} >= :number"
            check["ExpressionAttributeValues"] = serialize({":number": Decimal(number)})
        return {"ConditionCheck": check}

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


def _number_or_absent(value: Any) -> bool:
    return value is _ABSENT or (isinstance(value, Decimal) and value.is_finite())


def _fence(name: str, placeholder: str, verified: Any) -> str:
    if verified is _ABSENT:
        return f"attribute_not_exists({name})"
    return f"{name} = {placeholder}"
