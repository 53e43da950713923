"""Repairs on the main table, each fenced on the state that was verified.

Every write is conditioned on the exact state that was verified, carries the repair
marker, and goes in one transaction with the audit-table items the caller passes (the
repair log, the marker's record, the alert), so none of them can exist without the other.
On a strongly consistent Global Table (MRSC), which refuses every transaction that touches
it, a counter is set by the same fenced write alone; the caller commits its audit items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Literal

from botocore.exceptions import ClientError

from tally.core.dynamodb import Cancelled, Names, serialize, transact
from tally.core.regions import ORIGIN
from tally.reconciler.protocol import shards
from tally.reconciler.protocol.judgement import ParentState
from tally.reconciler.table.access import ABSENT, TableAccess
from tally.reconciler.table.void_keys import VOID, void_key
from tally.rules import (
    REPAIR_MARKER,
    AnyRule,
    CountRule,
    IndexMembers,
    Key,
    SequenceRule,
    TallyRule,
)

VoidOutcome = Literal["written", "arrived", "gone"]
DecrementOutcome = Literal["applied", "replayed", "refused"]


class FencedWrites(TableAccess):
    """SET a counter, apply a TTL decrement once, or write a VOID tombstone."""

    def set_counter(
        self,
        rule: AnyRule,
        key: Key,
        verified: ParentState,
        value: Decimal,
        marker: str,
        logged: Sequence[Mapping[str, Any]] | None,
        *,
        shard_region: str | None = None,
        regions: Sequence[str] = (),
    ) -> bool:
        """SET counter = value, only if the parent still exists with the counter and revision
        that were verified: a repair never creates a parent, nor writes over a non-number.
        With ``logged``, in one transaction with those audit items; None: the write alone.

        A counter split per Region is set through ``shard_region``'s shard (``set_split``)."""
        if isinstance(rule, TallyRule) and rule.split is not None:
            if shard_region is None or logged is None:
                raise ValueError(f"{rule.name}: a split counter is repaired in one transaction")
            return self.set_split(rule, key, verified, value, marker, logged, shard_region, regions)
        if not verified.exists or not _number_or_absent(verified.counter):
            raise ValueError(f"{rule.name}: a repair writes only over a number it has judged")
        names = Names.of(self._pk, rule.counter, rule.revision, REPAIR_MARKER)
        counter = _fence(names[rule.counter], ":stored", verified.counter)
        values: dict[str, Any] = {":value": value, ":marker": marker}
        if verified.counter is not ABSENT:
            values[":stored"] = verified.counter
        else:  # a NULL counter reads as absent (0), as judged: either may still stand
            counter += f" OR attribute_type({names[rule.counter]}, :null)"
            values[":null"] = "NULL"
        fences = [f"attribute_exists({names[self._pk]})", counter]
        update = f"SET {names[rule.counter]} = :value, {names[REPAIR_MARKER]} = :marker"
        if rule.revision:
            fences.append(_fence(names[rule.revision], ":revision", verified.revision))
            if verified.revision is not ABSENT:
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
        if logged is None:
            return self._fenced_alone(item["Update"], marker)
        return self._fenced([item, *logged])

    def set_split(
        self,
        rule: TallyRule,
        key: Key,
        verified: ParentState,
        value: Decimal,
        marker: str,
        logged: Sequence[Mapping[str, Any]],
        home: str,
        regions: Sequence[str],
    ) -> bool:
        """Set a split counter's total to ``value`` through the ``home`` Region's own shard
        (``protocol.shards.home_after``), in one transaction fenced on the whole state that
        was judged: the parent exists with its base and revision as read, every shard read
        holds its counter as read, and every other Region of ``regions`` still has none. A
        writer's shard write (or the parent's removal) between the judgement and this write
        fails the transaction: nothing is written. False then."""
        if not verified.exists or not isinstance(verified.counter, Decimal):
            raise ValueError(f"{rule.name}: a repair writes only over a number it has judged")
        read = dict(verified.shards)
        after = shards.home_after(read.get(home), verified.counter, value)
        if after is None:
            raise ValueError(f"{rule.name}: the home shard cannot hold the repaired total")
        names = Names.of(self._pk, rule.counter, rule.revision, REPAIR_MARKER, ORIGIN)
        counter = names[rule.counter]
        parent = [f"attribute_exists({names[self._pk]})", _fence(counter, ":base", verified.base)]
        values: dict[str, Any] = {}
        if verified.base is not ABSENT:
            values[":base"] = verified.base
        else:  # a NULL base reads as absent (0), as judged
            parent[-1] += f" OR attribute_type({counter}, :null)"
            values[":null"] = "NULL"
        if rule.revision:
            parent.append(_fence(names[rule.revision], ":revision", verified.revision))
            if verified.revision is not ABSENT:
                values[":revision"] = verified.revision
        actions: list[Mapping[str, Any]] = [self._check(key, parent, names, values)]
        for region in sorted({*read, *regions} - {home}):
            stored = {":stored": read[region]} if read.get(region) is not None else {}
            fence = [_fence(counter, ":stored", read.get(region))]
            actions.append(
                self._check(rule.shard_key(key, region, self.rules.table), fence, names, stored)
            )
        home_fence = _fence(counter, ":stored", read.get(home))
        home_values: dict[str, Any] = {":value": after, ":marker": marker, ":origin": home}
        if read.get(home) is not None:
            home_values[":stored"] = read[home]
        actions.append(
            {
                "Update": {
                    "TableName": self.name,
                    "Key": self._key(rule.shard_key(key, home, self.rules.table)),
                    "UpdateExpression": (
                        f"SET {counter} = :value, {names[REPAIR_MARKER]} = :marker, "
                        f"{names[ORIGIN]} = :origin"
                    ),
                    "ConditionExpression": home_fence,
                    "ExpressionAttributeNames": names.subset(rule.counter, REPAIR_MARKER, ORIGIN),
                    "ExpressionAttributeValues": serialize(home_values),
                }
            }
        )
        return self._fenced([*actions, *logged])

    def _check(
        self, key: Key, fences: Sequence[str], names: Names, values: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A ConditionCheck of ``key`` on every fence, with the names and values they use
        (DynamoDB refuses unused ones; the placeholders are #a0..#a4, none a prefix of
        another's)."""
        condition = " AND ".join(f"({f})" for f in fences)
        used = {n: a for n, a in names.expression_names.items() if n in condition}
        check: dict[str, Any] = {
            "TableName": self.name,
            "Key": self._key(key),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": used,
        }
        bound = {p: v for p, v in values.items() if p in condition}
        if bound:
            check["ExpressionAttributeValues"] = serialize(bound)
        return {"ConditionCheck": check}

    def decrement(
        self,
        rule: TallyRule,
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
                rule.members.number: Decimal(rule.shown_number(number)),
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

    def void_key(self, rule: SequenceRule, counter_key: Key, number: int) -> Key:
        """The key a VOID tombstone for ``number`` is written at."""
        return void_key(rule, counter_key, number, self.rules.table)

    def _fenced(self, items: list[Any]) -> bool:
        # No derived token: botocore's own token makes its retries idempotent, and each
        # repair's items (its marker, its log) are unique, so a new repair is never a replay.
        try:
            transact(self.client, items, None, self.backoff)
        except Cancelled:
            return False
        return True

    def _fenced_alone(self, update: dict[str, Any], marker: str) -> bool:
        """One conditional UpdateItem. A retry of a write that applied but whose answer was
        lost fails its own fence: the item it shows carrying this marker says it applied."""
        try:
            self.client.update_item(**update, ReturnValuesOnConditionCheckFailure="ALL_OLD")
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            old: Any = error.response.get("Item") or {}
            return bool(old.get(REPAIR_MARKER) == {"S": marker})
        return True


def _number_or_absent(value: Any) -> bool:
    return value is ABSENT or (isinstance(value, Decimal) and value.is_finite())


def _fence(name: str, placeholder: str, verified: Any) -> str:
    if verified is ABSENT:
        return f"attribute_not_exists({name})"
    return f"{name} = {placeholder}"
