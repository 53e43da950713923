"""Reads of a sequence's members above a number, in each of the rules' member layouts."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tally.core.dynamodb import Names, deserialize, serialize
from tally.reconciler.table.access import BATCH_GET, TableAccess
from tally.reconciler.table.parent_reads import ParentReads
from tally.reconciler.table.void_keys import VOID, index_void_key
from tally.rules import (
    AttributeMembers,
    CollectionMembers,
    IndexMembers,
    Key,
    PartitionMembers,
    SequenceRule,
)

# A member as read: its number, its key, and whether it is a VOID tombstone.
Member = tuple[int, Key, bool]


class MemberReads(TableAccess):
    """The numbers a sequence's members hold, and what one member holds now; a partition
    sequence's counter through ``parents``."""

    def __init__(self, parents: ParentReads):
        super().__init__(
            parents.client, parents.name, parents.rules, parents.backoff, parents.reads
        )
        self._parents = parents

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
        # The range starts at the first member's key above the watermark: the key carries
        # the member's own number, not its ordinal (counter_holds = "next" numbers from 0).
        first = rule.member_key(counter_key, above + 1, self.rules.table)[self._sk]
        if self.rules.table.numeric(self._sk):
            condition = f"{names[self._sk]} >= :start"
            values[":start"] = Decimal(first)
        else:
            condition = f"{names[self._sk]} BETWEEN :start AND :end"
            values[":start"] = first
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
                if number is not None and number > above and self._is_member(rule, key):
                    found.append((number, key, item.get(VOID) is True))
        return found

    def _partition_members(self, rule: SequenceRule, counter_key: Key, above: int) -> list[Member]:
        """Members above ``above`` by consistent point reads, each in its own partition.

        Numbers up to the counter are read, then on past it for as long as a hundred
        numbers hold a member: a writer ahead of its counter shows, far strays do not.
        """
        counter = self._parents.read_parent(rule, counter_key).counter
        counted = isinstance(counter, Decimal) and counter.is_finite() and counter > 0
        through = int(counter) if counted else 0
        found: list[Member] = []
        number, beyond = above + 1, True
        while number <= through or beyond:
            numbers = range(number, number + BATCH_GET)
            hits = self._get_members(rule, counter_key, numbers)
            found += hits
            beyond = any(n > through for n, _, _ in hits)
            number += BATCH_GET
        return sorted(found)

    def _get_members(self, rule: SequenceRule, counter_key: Key, numbers: range) -> list[Member]:
        table = self.rules.table
        keys = [rule.member_key(counter_key, n, table) for n in numbers]
        found = []
        for item in self._get_items(keys, VOID):
            key = self.rules.key_of(item)
            member = rule.member_number(key[table.partition_key])
            if member is not None:
                found.append((member, key, item.get(VOID) is True))
        return found

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
                # The attribute holds the member's own number, not its ordinal.
                {":seq": rule.sequence_name, ":above": Decimal(rule.shown_number(above))}
            ),
            ReturnConsumedCapacity="TOTAL",
        )
        for page in pages:
            self.reads.add(page, page["ScannedCount"])
            for raw in page["Items"]:
                item = deserialize(raw)
                number = rule.attribute_number(item[members.number])
                key = self.rules.key_of(item)
                if self._is_member(rule, key) and number is not None:
                    void = key == index_void_key(rule, members, number, self.rules.table)
                    found.append((number, key, void))
        return found

    def _is_member(self, rule: SequenceRule, key: Key) -> bool:
        """Only items the rule's member pattern claims count, whatever attributes others carry."""
        return any(m.rule is rule and m.role == "member" for m in self.rules.classify(key))
