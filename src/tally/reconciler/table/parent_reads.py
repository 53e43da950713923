"""Reads of a parent and recounts of its children, strongly consistent (a read that only
tells when to look excepted)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import Names, deserialize, serialize
from tally.core.numbers import NULL, add, number
from tally.reconciler.protocol import shards, window
from tally.reconciler.protocol.judgement import ChildTotal, ParentState
from tally.reconciler.protocol.window import Noted
from tally.reconciler.table.access import ABSENT, TableAccess
from tally.rules import AnyRule, Key, SumRule, TallyRule

Item = dict[str, Any]


class ParentReads(TableAccess):
    """A parent's counter and revision, and the count or sum of its children."""

    def read_parent(self, rule: AnyRule, key: Key, *, consistent: bool = True) -> ParentState:
        """The parent's counter and revision; ``consistent=False`` (half the read units) may
        answer an older state, for a read that only tells when to look."""
        through = getattr(rule, "through", None)
        stamps = through.stamps if through is not None else ()
        if through is not None and through.stamp_child is not None:
            stamps = (*stamps, through.stamp_child)
        total = through.stamp_total if through is not None else None
        names = Names.of(rule.counter, rule.revision, self._pk, *stamps, total)
        response = self.client.get_item(
            TableName=self.name,
            Key=self._key(key),
            ConsistentRead=consistent,
            ProjectionExpression=", ".join(
                names[a] for a in (self._pk, rule.counter, rule.revision, *stamps, total) if a
            ),
            ExpressionAttributeNames=names.expression_names,
            ReturnConsumedCapacity="TOTAL",
        )
        item = deserialize(response["Item"]) if "Item" in response else None
        self.reads.add(response, 1 if item else 0)
        if item is None:
            return ParentState(False)
        revision = item.get(rule.revision) if rule.revision else ABSENT
        if revision is None and rule.revision in item:
            revision = NULL  # a NULL revision is no absent one: no repair can bump it
        held = tuple(s if isinstance(s := item.get(name), str) else "" for name in stamps)
        if isinstance(rule, TallyRule) and rule.split is not None:
            base = item.get(rule.counter, ABSENT)
            parts = self.read_shards(rule, key, consistent=consistent)
            return ParentState(True, shards.total(base, parts), revision, base=base, shards=parts)
        if not held:
            return ParentState(True, item.get(rule.counter, ABSENT), revision)
        counter = item.get(rule.counter, ABSENT)
        stamped = item.get(total) if total else None
        return ParentState(True, counter, revision, held[:-1], held[-1] or None, stamped)

    def read_shards(self, rule: TallyRule, key: Key, *, consistent: bool = True) -> shards.Shards:
        """A split counter's shards, by Region (sorted), each with its counter as read: one
        query of the parent's item collection under the shard prefix (absent: None)."""
        assert self._sk is not None
        names = Names.of(self._pk, self._sk, rule.counter)
        prefix = rule.shard_prefix(self.rules.table)
        pages = self.client.get_paginator("query").paginate(
            TableName=self.name,
            KeyConditionExpression=(
                f"{names[self._pk]} = :pk AND begins_with({names[self._sk]}, :prefix)"
            ),
            ProjectionExpression=", ".join(names[a] for a in (self._pk, self._sk, rule.counter)),
            ExpressionAttributeNames=names.expression_names,
            ExpressionAttributeValues=serialize(
                {":pk": self._value(key, self._pk), ":prefix": prefix}
            ),
            ConsistentRead=consistent,
            ReturnConsumedCapacity="TOTAL",
        )
        found: list[tuple[str, Any]] = []
        for page in pages:
            self.reads.add(page, page["ScannedCount"])
            for raw in page["Items"]:
                item = deserialize(raw)
                value = item.get(rule.counter, ABSENT)
                if value is None and rule.counter in item:
                    value = NULL  # a NULL is no number: judged invalid, never read as 0
                found.append((str(item[self._sk])[len(prefix) :], value))
        return tuple(sorted(found))

    def parent_item(self, key: Key) -> dict[str, Any]:
        """The whole parent, consistently read ({} when it is gone): for the rare look at
        attributes no rule names (a Global Table's ``tallyWrites@`` stamps)."""
        response = self.client.get_item(
            TableName=self.name,
            Key=self._key(key),
            ConsistentRead=True,
            ReturnConsumedCapacity="TOTAL",
        )
        item = deserialize(response["Item"]) if "Item" in response else {}
        self.reads.add(response, 1 if item else 0)
        return item

    def tally_children(self, rule: TallyRule, parent_key: Key) -> ChildTotal:
        """Count or sum the children with paginated consistent queries (children found
        through an index: ``tally_indexed``)."""
        if rule.through is not None:
            return self.tally_indexed(rule, parent_key, ABSENT)
        self.reads.recounted()
        request = self._children_request(rule, parent_key)
        names = Names.of(self._pk, self._sk, rule.summed if isinstance(rule, SumRule) else None)
        if isinstance(rule, SumRule):
            request["ProjectionExpression"] = ", ".join(names.mapping.values())
            request["ExpressionAttributeNames"] = names.expression_names
        else:
            request["Select"] = "COUNT"  # the count alone: no item is returned
        children, items = 0, []
        for page in self.client.get_paginator("query").paginate(**request):
            self.reads.add(page, page["ScannedCount"])
            children += page["Count"]
            items += [deserialize(raw) for raw in page.get("Items", [])]
        return self._tally(rule, children, items)

    def _tally(self, rule: TallyRule, children: int, items: list[Item]) -> ChildTotal:
        """The truth over ``children`` children: their number, or the sum of the amounts the
        ``items`` hold (an amount that is no number counts 0, and is listed)."""
        if not isinstance(rule, SumRule):
            return ChildTotal(Decimal(children), children)
        total, unreadable = Decimal(0), []
        for item in items:
            amount = number(item.get(rule.summed, Decimal(0)))
            if isinstance(amount, Decimal):
                total = add(total, amount)
            else:
                unreadable.append((self.rules.key_of(item), amount))
        return ChildTotal(total, children, tuple(unreadable))

    def tally_indexed(
        self,
        rule: TallyRule,
        parent_key: Key,
        counter: Any,
        *,
        confirm: bool = True,
        recent: Sequence[Noted] = (),
        read: Key | None = None,
    ) -> ChildTotal:
        """Count or sum the children found through the rule's index, the ``recent`` ones (the
        children the stream showed changing within the rule's window) as the stream showed
        them last.

        The index is eventually consistent, with no bound on its lag: an entry may be
        missing (the child just joined this parent) or stale (the child since deleted, moved
        to another parent or out of the counted status). So a recent child is never counted
        as the index shows it, but as its note says; every other hit changed before the
        window and counts as the index shows it. When that total agrees with ``counter`` (or
        ``confirm`` is off: a look that only observes) it is the answer; otherwise every hit
        and every recent child is read consistently from the table, and counts only while its
        base item names this parent. The child at ``read`` (a writer's newest, perhaps not in
        the window yet) is always read from the table.
        """
        self.reads.recounted()
        through = rule.through
        assert through is not None
        status = through.sort_key if through.sort_prefix is not None else None
        names = Names.of(through.partition_key, status)
        condition = f"{names[through.partition_key]} = :parent"
        values: dict[str, Any] = {":parent": parent_key[self._pk]}
        if status is not None:
            condition += f" AND begins_with({names[status]}, :status)"
            values[":status"] = through.sort_prefix
        pages = self.client.get_paginator("query").paginate(
            TableName=self.name,
            IndexName=through.index,
            KeyConditionExpression=condition,
            ExpressionAttributeNames=names.expression_names,
            ExpressionAttributeValues=serialize(values),
            ReturnConsumedCapacity="TOTAL",
        )
        claimed = self.rules.claimed_by(rule)
        hits: dict[window.KeyId, Item] = {}
        for page in pages:
            self.reads.add(page, page["ScannedCount"])
            for raw in page["Items"]:
                item = deserialize(raw)
                key = self.rules.key_of(item)
                if claimed(key):
                    hits[window.key_id(key)] = item
        noted = window.latest(note for note in recent if claimed(note.key))
        pinned: list[Item] = []
        if read is not None:
            hits.pop(window.key_id(read), None)
            noted.pop(window.key_id(read), None)
            pinned = self._named(rule, parent_key, [read])
        summed = rule.summed if isinstance(rule, SumRule) else None
        # What the index shows of each hit: a sum's amount (absent counts 0), or nothing.
        listed = {id_: hit.get(summed, Decimal(0)) if summed else None for id_, hit in hits.items()}
        self.reads.looked_through_index(window.index_behind(listed, noted, time.time()))
        indexed, fresh = window.split(hits, noted)
        if all(note.counted is not None for note in fresh):
            shown = [*indexed, *(_as_item(rule, n) for n in fresh if n.counted), *pinned]
            total = self._tally(rule, len(shown), shown)
            if not total.unreadable and (total.actual == counter or not confirm):
                return total
        keys = [self.rules.key_of(item) for item in indexed] + [note.key for note in fresh]
        confirmed = [*self._named(rule, parent_key, keys), *pinned]
        return self._tally(rule, len(confirmed), confirmed)

    def _named(self, rule: TallyRule, parent_key: Key, keys: Sequence[Key]) -> list[Item]:
        """The children at ``keys`` whose base items name ``parent_key``: not a stale entry
        (the child did not move, nor leave the counted status), read consistently."""
        through = rule.through
        assert through is not None
        summed = rule.summed if isinstance(rule, SumRule) else None
        return [
            item
            for item in self._get_items(keys, *through.attributes, summed)
            if rule.indexed_parent(item, self.rules.table) == parent_key
        ]

    def newest_child(self, rule: TallyRule, parent: ParentState) -> Key | None:
        """The child of the parent's newest stamp, if it names a child key of the rule."""
        try:
            key = json.loads(parent.stamped_child or "")
        except ValueError:
            return None
        if not isinstance(key, dict) or set(key) != set(self.rules.table.names):
            return None
        if not all(isinstance(v, str) for v in key.values()):
            return None
        return key if self.rules.claimed_by(rule)(key) else None

    def has_more_children(self, rule: TallyRule, parent_key: Key, than: int) -> bool:
        """Does the parent have more than ``than`` children? One ``Select=COUNT`` query of at
        most ``than + 1`` children (about 1 RCU for small ones), not a recount."""
        request = self._children_request(rule, parent_key)
        request |= {"Select": "COUNT", "Limit": than + 1, "ConsistentRead": False}
        response = self.client.query(**request)
        self.reads.add(response, response["ScannedCount"])
        return response["Count"] > than or "LastEvaluatedKey" in response

    def _children_request(self, rule: TallyRule, parent_key: Key) -> dict[str, Any]:
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


def _as_item(rule: TallyRule, note: Noted) -> Item:
    """A noted child as the stream showed it last: its key and (a sum's) amount."""
    item: Item = dict(note.key)
    if isinstance(rule, SumRule) and note.amount is not None:
        item[rule.summed] = note.amount
    return item
