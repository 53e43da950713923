"""Count and sum writers (reference counts): the child write and the counter bump in one
transaction.

A child found through an index (a rule with ``through``) names its parent in its index key
attributes, not in its key: the writer derives the parent from the item it writes, or from
the item it read, and fences the write on the index key values read (``tally.writers.indexed``).
``move_child`` re-parents such a child, or moves it out of or into the counted status.

A counter split per Region (a rule with ``split``) takes the delta on the writer's own
Region's shard beside the parent, in the same transaction, and the parent is only checked:
each shard is written by one Region, so last writer wins drops none of its increments.

Every call reports what it did. Each transaction carries a fresh ``ClientRequestToken``:
botocore's retry of it after a lost response is a replay of the same commit, and a repeated
call is a new request (like, unlike, like again all count). Under an idempotency key a guard
item in the same transaction remembers the outcome (``tally.writers.idempotency``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Literal, cast

from botocore.exceptions import ClientError

import tally.writers.indexed as indexed
import tally.writers.items as items
import tally.writers.mrsc_tallies as mrsc_tallies
import tally.writers.stamps as stamps
from tally.core.dynamodb import (
    Cancelled,
    TransactionFailedError,
)
from tally.rules import AnyRule, IndexChildren, Key, Match, SumRule, TallyRule
from tally.writers.errors import (
    Field,
    IdempotencyConflictError,
    InvalidRequestError,
    ParentHomedElsewhereError,
    ParentNotFoundError,
)
from tally.writers.fenced import fenced_writes, within_domain
from tally.writers.idempotency import GuardedWriter, Keyed, Record
from tally.writers.mrsc import refuse_marks
from tally.writers.parents import (
    judge_parent,
    parent_check,
    parent_update,
    raise_for_parent,
    total_limit,
)
from tally.writers.regional import homed_elsewhere
from tally.writers.reserved import refuse_regional, refuse_reserved, reserved_attributes
from tally.writers.transactions import (
    new_token,
    read_item,
    retrying,
)

Outcome = Literal["created", "already_present", "removed", "not_present", "changed", "unchanged"]
_Operation = Literal["add", "remove", "change", "move"]
_DONE: dict[_Operation, Outcome] = {
    "add": "created",
    "remove": "removed",
    "change": "changed",
    "move": "changed",
}


@dataclass(frozen=True)
class WriteResult:
    """What a write did. ``replayed``: this call wrote nothing; it answers with the outcome an
    earlier call under the same idempotency key got."""

    outcome: Outcome
    replayed: bool = False
    attempts: int = 1


@dataclass(frozen=True)
class _Write:
    """One call: its target, its key's request, and (change) the amount or (move) the index
    key values it sets. ``parent_key`` is empty for a child found through an index."""

    operation: _Operation
    key: Key
    parent_key: Key
    rule: TallyRule
    keyed: Keyed | None
    new: Decimal | None = None
    index: Mapping[str, Any] | None = None
    item: Mapping[str, Any] | None = None


class TallyWriter(GuardedWriter):
    """Adds, removes and changes children of count and sum rules, one transaction each (on an
    MRSC table, ``consistency="strong"``: the child's write, then the counter's)."""

    def add_child(
        self,
        key: Mapping[str, str],
        attributes: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> WriteResult:
        """Put the child if absent and add 1 (count) or its amount (sum) to the parent.

        A child found through an index carries its index key attributes in ``attributes``
        (and the status, for a rule with ``sort_prefix``): they name its parent."""
        match = self._match(key)
        rule = match.rule
        assert isinstance(rule, TallyRule)
        if self.strong is not None:
            mrsc_tallies.refuse(rule, idempotency_key)
        item = self._child_item(rule, key, attributes or {})
        parent_key = match.parent_key
        if rule.through is not None:
            indexed.check_index_keys(rule, self._keys, item, ("attributes",))
            parent_key = indexed.named_parent(rule, item, self._keys, ("attributes",))
        keyed = self.guards.request(idempotency_key, "add", key, item)
        write = _Write("add", dict(key), parent_key, rule, keyed, item=item)
        delta = item[rule.summed] if isinstance(rule, SumRule) else Decimal(1)
        child = self._on_key("Put", item)
        amount = ("attributes", rule.summed) if isinstance(rule, SumRule) else None
        if self.strong is not None:
            return _done(mrsc_tallies.add(self.strong, rule, parent_key, item, delta, amount))
        try:
            return self._commit(write, child, [(parent_key, delta)], amount)
        except Cancelled as cancelled:
            return self._settle(write, "already_present", cancelled.attempts)

    def remove_child(
        self, key: Mapping[str, str], *, idempotency_key: str | None = None
    ) -> WriteResult:
        """Delete the child if present and subtract 1 (count) or its amount (sum)."""
        match = self._match(key)
        rule = match.rule
        assert isinstance(rule, TallyRule)
        if self.strong is not None:
            mrsc_tallies.refuse(rule, idempotency_key)
            return _done(mrsc_tallies.remove(self.strong, rule, dict(key), match.parent_key))
        keyed = self.guards.request(idempotency_key, "remove", key)
        write = _Write("remove", dict(key), match.parent_key, rule, keyed)
        if isinstance(rule, SumRule) or rule.through is not None:
            return self._read_and_write(write, ("key",))
        child = self._on_key("Delete", key)
        try:
            return self._commit(write, child, [(match.parent_key, Decimal(-1))], None)
        except Cancelled as cancelled:
            return self._settle(write, "not_present", cancelled.attempts)

    def change_amount(
        self, key: Mapping[str, str], amount: Decimal | int, *, idempotency_key: str | None = None
    ) -> WriteResult:
        """Set a sum child's amount and add the difference to the parent's total."""
        match = self._match(key)
        rule = match.rule
        if not isinstance(rule, SumRule):
            raise InvalidRequestError(
                ("amount",),
                f"rule {rule.name!r} is a {rule.kind} rule: only sum children have amounts",
            )
        new = in_domain(amount, rule, ("amount",))
        if self.strong is not None:
            mrsc_tallies.refuse(rule, idempotency_key)
            return _done(mrsc_tallies.change(self.strong, rule, dict(key), match.parent_key, new))
        keyed = self.guards.request(idempotency_key, "change", key, new)
        write = _Write("change", dict(key), match.parent_key, rule, keyed, new)
        return self._read_and_write(write, ("amount",))

    def move_child(
        self,
        key: Mapping[str, str],
        attributes: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
    ) -> WriteResult:
        """Set a child's index key attributes (None removes one), found through an index, and
        move its count (or amount) from the parent its stored item names to the parent the
        new values name: a re-parent, or a move out of or into the counted status (one side
        then no parent). ``changed``, ``unchanged`` or ``not_present``."""
        match = self._match(key)
        rule = match.rule
        assert isinstance(rule, TallyRule)
        if rule.through is None:
            raise InvalidRequestError(
                ("key",),
                f"rule {rule.name!r} counts the children of its parent's item collection: "
                "only a child found through an index ('through') moves between parents",
            )
        if self.strong is not None:
            mrsc_tallies.refuse(rule, idempotency_key)
        moves = indexed.index_values(rule, self._keys, attributes, ("attributes",))
        keyed = self.guards.request(idempotency_key, "move", key, moves)
        write = _Write("move", dict(key), match.parent_key, rule, keyed, index=moves)
        return self._read_and_write(write, ("attributes",))

    # --- requests -----------------------------------------------------------------------

    def _match(self, key: Mapping[str, Any]) -> Match:
        """The count or sum rule the key is a child of (in its parent's item collection, or
        found through an index), in the rules' order."""
        try:
            self.rules.validate_key(key)
        except ValueError as error:
            raise InvalidRequestError(("key",), str(error)) from None
        for match in self.rules.classify(key):
            if match.role in ("child", "indexed"):
                items.check_key(key, self.rules.table, ("key",))
                self._refuse_split(match.rule)
                return match
        raise InvalidRequestError(
            ("key",), f"key {dict(key)} is not a child of any count or sum rule"
        )

    def _refuse_split(self, rule: AnyRule) -> None:
        """A counter split per Region is written to this writer's Region's shard: a writer
        with no Region has none, and an MRSC writer sends no transaction to write it in."""
        if not isinstance(rule, TallyRule) or rule.split is None:
            return
        if self.region is None:
            raise InvalidRequestError(
                ("key",),
                f"rule {rule.name!r} splits its counter per Region (split = 'region'): its "
                "writers write their Region's shard; make the writer with region=... (the "
                "writer API: deploy with GlobalRegions)",
            )
        if self.strong is not None:
            raise InvalidRequestError(
                ("key",),
                f"rule {rule.name!r} splits its counter per Region: its writes are one "
                "transaction, which an MRSC table refuses (on MRSC every Region's writes to "
                "one counter are conditions on one item: no split is needed)",
            )

    def _child_item(
        self,
        rule: TallyRule,
        key: Mapping[str, str],
        attributes: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The child as it will be stored; refused, naming the field, if DynamoDB or the rules
        would refuse it."""
        field: Field = ("attributes",)
        values = items.attributes(attributes, field)
        refuse_reserved(values, reserved_attributes(self.rules, rule), field)
        if self.region is not None:
            refuse_regional(values, field)
        if self.strong is not None:
            refuse_marks(values, field)
        if isinstance(rule, SumRule):
            amount: Field = (*field, rule.summed)
            if rule.summed not in values:
                raise InvalidRequestError(amount, f"a {rule.name!r} child needs its amount")
            values[rule.summed] = in_domain(values[rule.summed], rule, amount)
        item = {**values, **key}
        items.check_size(item, field)
        return item

    # --- committing ---------------------------------------------------------------------

    def _commit(
        self,
        write: _Write,
        child: dict[str, Any],
        parents: list[tuple[Key, Decimal]],
        amount: Field | None,
        current: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        """Commit the child's write, each parent's ``ADD delta`` (none, one, or the old and
        the new parent of a move) and the key's guard; ``Cancelled`` when the child's condition
        failed, which the caller turns into its outcome."""
        done = _DONE[write.operation]
        rule = write.rule
        writes = [child]
        split = self._split(rule, parents)
        if split:
            # This Region's shard takes the delta, and the parent is only checked.
            writes += [
                parent_update(self.table_name, k, rule, d, self._keys, shard=True) for k, d in split
            ]
            assert self.region is not None
            region = self.region
            writes += [parent_check(self.table_name, k, self._keys, region) for k, _ in parents]
        else:
            writes += [parent_update(self.table_name, k, rule, d, self._keys) for k, d in parents]
        if (through := stamps.stamping(rule)) is not None:
            self._stamp(write, through, writes, parents, current)
        guard = [self.guards.put(write.keyed, done)] if write.keyed else []
        try:
            committed = self._transact([*writes, *guard], new_token())
        except Cancelled as cancelled:
            if write.keyed and (record := self.guards.taken(cancelled, len(writes))):
                return self._replay(write, record)
            if write.operation != "add" and rule.through is not None and cancelled.failed(0):
                raise  # the edge moved since it was read: the parents tried may be stale
            beyond = None
            if amount is not None:
                message = f"the parent's {rule.counter!r} would pass ±{total_limit(rule)}"
                beyond = InvalidRequestError(amount, message)
            for position, (key, delta) in enumerate(split or parents, start=1):
                raise_for_parent(cancelled, position, key, rule, delta, out_of_range=beyond)
            for position, (key, _) in enumerate(parents, start=len(split) + 1):
                if split and cancelled.failed(position):
                    raise_for_split_parent(cancelled, position, key, self.region)
            raise
        except TransactionFailedError as failed:
            messages = _messages(failed)
            written = write.index or write.item or {}
            if rule.through and (name := indexed.refused_index_key(messages, rule, written)):
                field = indexed.field_of(name, self._keys, ("attributes",))
                why = "; ".join(m for m in messages if m)
                raise InvalidRequestError(
                    field, f"index {rule.through.index!r} refused it as its key: {why}"
                ) from failed
            refusal = _number_refusal(messages)
            if refusal is None:
                raise
            # DynamoDB refused a number: find out whose, reading the parents (nothing written).
            for key, _ in split or parents:
                judge_parent(self._get(key) or ({} if split else None), key, rule)
            if amount is None:
                raise
            raise InvalidRequestError(
                amount, f"the parent's {rule.counter!r} cannot take it: {refusal}"
            ) from failed
        return WriteResult(done, attempts=committed.attempts)

    def _split(
        self, rule: TallyRule, parents: list[tuple[Key, Decimal]]
    ) -> list[tuple[Key, Decimal]]:
        """For a counter split per Region, each parent's delta on this Region's shard of it;
        [] for any other counter."""
        if rule.split is None:
            return []
        assert self.region is not None  # refused without one (``_refuse_split``)
        return [(rule.shard_key(k, self.region, self._keys), d) for k, d in parents]

    def _stamp(
        self,
        write: _Write,
        through: IndexChildren,
        writes: list[dict[str, Any]],
        parents: list[tuple[Key, Decimal]],
        current: Mapping[str, Any] | None,
    ) -> None:
        """A fresh token on the child; on each parent, the token (the child's last one,
        marked, on a parent it leaves) with the child's key (``current``: the child as read)."""
        token = stamps.new_token(write.key)
        stamps.stamp_child(writes[0], through, token)
        after: Mapping[str, Any] | None = None
        if write.operation == "add":
            after = write.item
        elif write.operation == "change":
            after = current
        elif write.operation == "move" and current is not None and write.index is not None:
            moved = {**current, **write.index}
            after = {name: value for name, value in moved.items() if value is not None}
        joined = write.rule.indexed_parent(after, self._keys) if after else None
        old = current.get(through.stamp) if current and through.stamp else None
        for update, (key, delta) in zip(writes[1:], parents, strict=True):
            stamp = stamps.parent_stamp(token, old, joins=key == joined)
            stamps.stamp_parent(update, through, stamp, write.key, delta)

    def _settle(self, write: _Write, outcome: Outcome, attempts: int) -> WriteResult:
        """An outcome that wrote nothing; under a key it is stored unless the key is taken."""
        if write.keyed and (record := self.guards.record(write.keyed, outcome)):
            return self._replay(write, record)
        return WriteResult(outcome, attempts=attempts)

    def _replay(self, write: _Write, record: Record) -> WriteResult:
        """The key's stored outcome, if what its request left is still there."""
        assert write.keyed is not None
        self.guards.answer(write.keyed, record)
        if not _still_holds(write, record.outcome, self._get(write.key)):
            raise IdempotencyConflictError(
                write.keyed.key,
                "superseded",
                f"its request got {record.outcome!r}, but child {write.key} has changed since; "
                "a new request needs a new key",
            )
        return WriteResult(cast(Outcome, record.outcome), replayed=True)

    # --- writes that read the child first ------------------------------------------------

    def _read_and_write(self, write: _Write, field: Field) -> WriteResult:
        """Transactions cannot read: read the child, then write fenced on what was read (a
        sum's amount, an indexed child's index key values); read again if it moved."""
        attempts = 0
        for attempt in retrying(self.backoff):
            attempts = attempt
            current = self._get(write.key)
            if current is None:
                return self._settle(write, "not_present", attempt)
            planned = fenced_writes(
                self.table_name,
                self._keys,
                write.operation,
                write.key,
                write.parent_key,
                write.rule,
                current,
                write.new,
                write.index,
            )
            if planned is None:
                return self._settle(write, "unchanged", attempt)
            try:
                result = self._commit(write, *planned, field, current)
            except Cancelled:
                continue  # the child moved between our read and our write
            return replace(result, attempts=result.attempts + attempt - 1)
        raise RuntimeError(f"child {write.key} kept changing over {attempts} attempts")

    def _get(self, key: Key) -> dict[str, Any] | None:
        response = self.client.get_item(
            TableName=self.table_name, Key=self._key(key), ConsistentRead=True
        )
        return read_item(response.get("Item"))


def raise_for_split_parent(
    cancelled: Cancelled, position: int, key: Key, region: str | None
) -> None:
    """A split counter's parent check failed: the parent is gone, or homed elsewhere."""
    old = cancelled.old_item(position)
    if region is not None and (home := homed_elsewhere(old, region)):
        raise ParentHomedElsewhereError(key, home, region)
    raise ParentNotFoundError(key)


def _done(done: mrsc_tallies.Done) -> WriteResult:
    outcome, sends = done
    return WriteResult(cast(Outcome, outcome), attempts=max(sends, 1))


def in_domain(value: Any, rule: SumRule, field: Field) -> Decimal:
    """The amount as stored, or a refusal naming the field and the rule's amount domain."""
    amount = items.number(value, field)
    if not within_domain(amount, rule):
        raise InvalidRequestError(
            field,
            f"{amount} is outside rule {rule.name!r}'s amount domain: at most {rule.scale} "
            f"decimal places and at most {rule.max_amount} either side of 0 "
            f"(scale = {rule.scale}, max_amount = {rule.max_amount})",
        )
    return amount


def _still_holds(write: _Write, outcome: str, item: Mapping[str, Any] | None) -> bool:
    """Whether the child is still as the key's request left it."""
    if outcome in ("removed", "not_present"):
        return item is None
    if item is None:
        return False
    if write.operation == "move":
        assert write.index is not None
        return all(item.get(name) == value for name, value in write.index.items())
    if write.operation != "change" or not isinstance(write.rule, SumRule):
        return True
    return bool(item.get(write.rule.summed) == write.new)


def _messages(failed: TransactionFailedError) -> list[str]:
    """DynamoDB's messages on a failed transaction: each item's, and the error's."""
    messages = [str(reason.get("Message", "")) for reason in failed.reasons]
    if isinstance(failed.__cause__, ClientError):
        messages.append(str(failed.__cause__.response.get("Error", {}).get("Message", "")))
    return messages


def _number_refusal(messages: list[str]) -> str | None:
    """DynamoDB's message when it refused a number the transaction would store."""
    for message in messages:
        if "number" in message.lower() or "precision" in message.lower():
            return message
    return None
