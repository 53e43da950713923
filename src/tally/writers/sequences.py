"""Auto-increment numbers by four strategies, behind one ``allocate`` call.

- ``atomic``: ADD to the counter and take the new value, then put the member. Cheapest,
  but a crash between the two steps leaves a gap (the reconciler voids it).
- ``gapless`` (a counter under an optimistic lock): consistent read of the counter, then one
  transaction of the counter update conditioned on the value read and the member put
  conditioned on absence.
- ``sortkey`` (numbers as sort keys): query the highest member, put the next one conditionally,
  retry with +1; the counter follows in the same transaction.
- ``block``: ``gapless`` for k consecutive numbers and their k members in one transaction.

Every request is checked whole before the first write. A lost response changes nothing:
transactions carry a fresh token per body, so botocore's resend is a replay; the atomic
counter update carries the call's own marker (``ALLOCATION_MARKER``), so a resend of an
increment that committed is recognised instead of counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Literal, cast

import tally.writers.mrsc_sequences as mrsc_sequences
from tally.core.dynamodb import Cancelled, Names, deserialize, serialize
from tally.rules import CollectionMembers, IndexMembers, Key
from tally.writers.allocations import AllocationRequest, Strategy, allocation_request
from tally.writers.errors import CounterBehindError, InvalidCounterError
from tally.writers.idempotency import GuardedWriter, Keyed, Record
from tally.writers.items import LARGEST
from tally.writers.mrsc import refuse_marks
from tally.writers.mrsc_sequences import update_counter
from tally.writers.reserved import refuse_regional
from tally.writers.transactions import (
    REVISION_LIMIT,
    new_token,
    number_or_none,
    old_item,
    read_item,
    retrying,
    revision_guard,
)

__all__ = ["ALLOCATION_MARKER", "Allocation", "SequenceAllocator", "Strategy"]

# Set on the counter by each atomic increment: the id of the call that made it.
ALLOCATION_MARKER = "tallyAllocation"
# An atomic ADD applies to a counter within this many whole numbers of the value read (the
# most values a condition's IN takes); further off, the counter is read again.
_WINDOW = 100


@dataclass(frozen=True)
class Allocation:
    """Numbers handed out and the members written for them.

    ``already_present``: the natural-key member existed; ``numbers`` holds its number, and an
    ``atomic`` allocation burnt ``wasted`` (a gap the reconciler will void). ``replayed``: this
    call wrote nothing; it answers with what an earlier call under its idempotency key got.
    """

    numbers: tuple[int, ...]
    member_keys: tuple[Key, ...]
    outcome: Literal["allocated", "already_present"] = "allocated"
    retries: int = 0
    wasted: tuple[int, ...] = field(default=())
    replayed: bool = False


class SequenceAllocator(GuardedWriter):
    """Hands out numbers for the sequence rules of a rules file."""

    def allocate(
        self,
        counter_key: Mapping[str, str],
        *,
        strategy: Strategy = "gapless",
        count: int = 1,
        attributes: Mapping[str, Any] | None = None,
        member_key: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> Allocation:
        """Allocate ``count`` numbers (``block`` only; 1 otherwise) and write their members.

        Under an ``idempotency_key`` a repeat of the request answers the numbers the first call
        got, without allocating again.
        """
        request = allocation_request(
            self.rules, counter_key, strategy, count, attributes or {}, member_key
        )
        if self.region is not None:
            refuse_regional(request.attributes, ("attributes",))
        if self.strong is not None:
            mrsc_sequences.refuse(request, strategy, idempotency_key)
            refuse_marks(request.attributes, ("attributes",))
        keyed = self.guards.request(
            idempotency_key,
            "allocate",
            request.counter_key,
            strategy,
            count,
            request.attributes,
            request.member_key,
        )
        if keyed is not None:
            record = self.guards.read(keyed)
            if record is not None:
                return self._replay(keyed, record)
            request = replace(request, keyed=keyed)
        if strategy == "atomic":
            return self._atomic(request)
        if strategy == "sortkey":
            return self._sortkey(request)
        return self._gapless(request)

    # --- atomic -------------------------------------------------------------------------

    def _atomic(self, request: AllocationRequest) -> Allocation:
        rule = request.rule
        call = new_token()
        names = Names.of(rule.counter, rule.revision, ALLOCATION_MARKER)
        counter, marker = names[rule.counter], names[ALLOCATION_MARKER]
        adds = [f"{counter} :count"]
        values: dict[str, Any] = {":count": Decimal(request.count), ":call": call}
        revision, revision_values = revision_guard(names, rule.revision)
        if rule.revision:
            adds.append(f"{names[rule.revision]} :one")
            values[":one"] = Decimal(1)
        if isinstance(rule.members, IndexMembers) and (taken := self._natural_member(request)):
            # Already registered: answered without burning a number (only a race between two
            # first registrations of one key can still burn one, a gap the reconciler voids).
            return self._existing(request, taken, 0, wasted=())
        current = self._read_counter(request)
        for _ in retrying(self.backoff):
            # The ADD applies only to a counter still one of the whole numbers it may be: a
            # fractional, negative or overflowing counter fails the condition, unchanged.
            window = self._window(request, current)
            condition = [
                f"({counter} IN ({', '.join(window)})"
                + (f" OR attribute_not_exists({counter}))" if current == 0 else ")"),
                f"(attribute_not_exists({marker}) OR {marker} <> :call)",
                *revision,
            ]
            update = {
                "TableName": self.table_name,
                "Key": self._key(request.counter_key),
                "UpdateExpression": f"ADD {', '.join(adds)} SET {marker} = :call",
                "ConditionExpression": " AND ".join(condition),
                "ExpressionAttributeNames": names.expression_names,
                "ExpressionAttributeValues": serialize(values | revision_values | window),
                "ReturnValues": "UPDATED_NEW",
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
            sent = update_counter(self.client, self.region, self.strong, update)
            counted = sent.item or {}
            if not sent.ok and counted.get(ALLOCATION_MARKER) != call:
                # Moved past the window, or to something a writer cannot build on.
                current = self._counter_value(request, counted)
                continue
            # Ours: committed now, or earlier with its answer lost (the resend found our marker).
            last = self._counter_value(request, counted, taken=True)
            numbers = tuple(range(last - request.count + 1, last + 1))
            return self._put_members(request, numbers, call)
        raise RuntimeError(
            f"counter {request.counter_key} stayed contended for {self.backoff.rounds} rounds"
        )

    def _window(self, request: AllocationRequest, current: int) -> dict[str, Decimal]:
        """The whole numbers the counter may hold for an ADD from ``current`` to be exact:
        ``current`` and up to 99 above it (another writer's ADDs since our read), while the
        new value stays within 38 digits."""
        top = min(current + _WINDOW - 1, int(LARGEST) - request.count)
        return {f":w{i}": Decimal(n) for i, n in enumerate(range(current, top + 1))}

    def _put_members(
        self, request: AllocationRequest, numbers: tuple[int, ...], call: str
    ) -> Allocation:
        """Second step of ``atomic``; a crash before it ends leaves the numbers as gaps.

        A one-item transaction rather than a PutItem: its token makes botocore's resend after a
        lost response a replay, where a conditional put would find its own member. On MRSC a
        PutItem carrying the call's token, which a resend finds.
        """
        members = [request.member(self.rules.table, number) for number in numbers]
        if self.strong is not None:
            put = self.strong.put_new(members[0], call)
            if not put.ok:
                return self._existing(request, put.item or {}, numbers[0], wasted=numbers)
            return Allocation(numbers, (self.rules.key_of(members[0]),))
        writes = [self._put_absent(member) for member in members]
        writes += self._guard(request, "allocated", numbers, members)
        try:
            self._transact(writes, new_token())
        except Cancelled as cancelled:
            if request.keyed and (record := self.guards.taken(cancelled, len(members))):
                return self._replay(request.keyed, record)
            index = next(i for i in range(len(members)) if cancelled.failed(i))
            existing = old_item(cancelled, index) or {}
            return self._existing(request, existing, numbers[index], wasted=numbers)
        return Allocation(numbers, tuple(self.rules.key_of(m) for m in members))

    # --- gapless and block --------------------------------------------------------------

    def _gapless(self, request: AllocationRequest) -> Allocation:
        rule = request.rule
        if self.strong is not None:
            done = mrsc_sequences.gapless(
                self.strong,
                request,
                lambda: self._read_counter(request),
                lambda old, new: self._advance(request, old, new),
                new_token(),
            )
            number, member, lost = done
            return Allocation((number,), (self.rules.key_of(member),), retries=lost)
        current = self._read_counter(request)
        for attempt in retrying(self.backoff):
            numbers = tuple(range(current + 1, current + request.count + 1))
            members = [request.member(self.rules.table, n) for n in numbers]
            names = Names.of(self._pk, rule.counter, rule.revision)
            counter = names[rule.counter]
            fenced = f"{counter} = :old" + (
                f" OR attribute_not_exists({counter})" if current == 0 else ""
            )
            values = {":old": Decimal(current), ":new": Decimal(numbers[-1])}
            writes = [
                self._set_counter(request, names, ":new", fenced, values),
                *(self._put_absent(member) for member in members),
                *self._guard(request, "allocated", numbers, members),
            ]
            try:
                self._transact(writes, new_token())
            except Cancelled as cancelled:
                if request.keyed and (record := self.guards.taken(cancelled, len(members) + 1)):
                    return self._replay(request.keyed, record)
                if cancelled.failed(0):
                    # Another writer moved the counter: its old image says where it is now.
                    current = self._counter_value(request, old_item(cancelled, 0))
                    continue
                index = next(i for i in range(1, len(members) + 1) if cancelled.failed(i))
                return self._collision(
                    request, old_item(cancelled, index) or {}, numbers[index - 1], attempt
                )
            return Allocation(
                numbers, tuple(self.rules.key_of(m) for m in members), retries=attempt - 1
            )
        raise RuntimeError(
            f"counter {request.counter_key} stayed contended for {self.backoff.rounds} rounds"
        )

    # --- sort key -----------------------------------------------------------------------

    def _sortkey(self, request: AllocationRequest) -> Allocation:
        rule = request.rule
        current = self._read_counter(request)
        number = max(self._highest_member(request), current) + 1
        for attempt in retrying(self.backoff):
            member = request.member(self.rules.table, number)
            names = Names.of(self._pk, rule.counter, rule.revision)
            counter = names[rule.counter]
            # Fenced on the counter as read: a counter that moved, or that no allocation may
            # build on, fails the transaction and is read again from its old image.
            fenced = f"{counter} = :old" + (
                f" OR attribute_not_exists({counter})" if current == 0 else ""
            )
            values = {":old": Decimal(current), ":n": Decimal(number)}
            writes = [
                self._put_absent(member),
                self._set_counter(request, names, ":n", fenced, values),
                *self._guard(request, "allocated", (number,), [member]),
            ]
            try:
                self._transact(writes, new_token())
            except Cancelled as cancelled:
                if request.keyed and (record := self.guards.taken(cancelled, 2)):
                    return self._replay(request.keyed, record)
                if cancelled.failed(0):
                    number += 1  # lost the race for this number: try the next
                if cancelled.failed(1):
                    # The counter moved: numbers up to it are claimed.
                    current = self._counter_value(request, old_item(cancelled, 1))
                    number = max(number, current + 1)
                continue
            return Allocation((number,), (self.rules.key_of(member),), retries=attempt - 1)
        raise RuntimeError(
            f"sequence {request.counter_key} stayed contended for {self.backoff.rounds} rounds"
        )

    def _highest_member(self, request: AllocationRequest) -> int:
        members = request.rule.members
        sk = self._keys.sort_key
        assert isinstance(members, CollectionMembers) and sk is not None
        names = Names.of(self._pk, sk)
        span = request.rule.member_pattern(self.rules.table)[sk]
        # Members of a number sort key are the positive numbers; of a string one, the prefix.
        condition = "{} > :start" if span.numeric else "begins_with({}, :start)"
        counter = self.rules.table.typed(request.counter_key)
        response = self.client.query(
            TableName=self.table_name,
            KeyConditionExpression=(f"{names[self._pk]} = :pk AND " + condition.format(names[sk])),
            ExpressionAttributeNames=names.expression_names,
            ExpressionAttributeValues=serialize(
                {":pk": counter[self._pk], ":start": Decimal(0) if span.numeric else span.value}
            ),
            ScanIndexForward=False,
            ConsistentRead=True,
            ProjectionExpression=names[sk],
        )
        for item in response["Items"]:
            number = request.rule.member_number(deserialize(item)[sk])
            if number is not None:
                return number
        return 0

    # --- shared -------------------------------------------------------------------------

    def _read_counter(self, request: AllocationRequest) -> int:
        names = Names.of(request.rule.counter, request.rule.revision)
        response = self.client.get_item(
            TableName=self.table_name,
            Key=self._key(request.counter_key),
            ConsistentRead=True,
            ProjectionExpression=", ".join(names.expression_names),
            ExpressionAttributeNames=names.expression_names,
        )
        return self._counter_value(request, read_item(response.get("Item")))

    def _natural_member(self, request: AllocationRequest) -> dict[str, Any] | None:
        assert request.member_key is not None
        response = self.client.get_item(
            TableName=self.table_name, Key=self._key(request.member_key), ConsistentRead=True
        )
        return read_item(response.get("Item"))

    def _counter_value(
        self, request: AllocationRequest, item: Mapping[str, Any] | None, taken: bool = False
    ) -> int:
        """The counter as a whole number an allocation of ``request.count`` can build on (or,
        ``taken``, has just built on); InvalidCounterError naming it otherwise, and naming the
        revision when that cannot take one more."""
        rule, key = request.rule, request.counter_key
        room = int(LARGEST) - (0 if taken else request.count)
        value = number_or_none(item, rule.counter, key, sequence=True)
        if value is not None and int(value) > room:
            raise InvalidCounterError(
                key,
                rule.counter,
                value,
                f"holds {value}: {request.count} more would pass {LARGEST}, the most it keeps",
            )
        if rule.revision is not None and not taken:
            number_or_none(item, rule.revision, key, limit=REVISION_LIMIT, scale=0)
        return int(value or 0)

    def _set_counter(
        self,
        request: AllocationRequest,
        names: Names,
        value: str,
        condition: str,
        values: dict[str, Any],
    ) -> dict[str, Any]:
        """The counter's conditional SET (and revision bump) for a transaction."""
        rule = request.rule
        update = f"SET {names[rule.counter]} = {value}"
        revision, revision_values = revision_guard(names, rule.revision)
        if rule.revision:
            update += f" ADD {names[rule.revision]} :one"
            values = values | {":one": Decimal(1)} | revision_values
        return {
            "Update": {
                "TableName": self.table_name,
                "Key": self._key(request.counter_key),
                "UpdateExpression": update,
                "ConditionExpression": " AND ".join([f"({condition})", *revision]),
                "ExpressionAttributeNames": names.subset(rule.counter, rule.revision),
                "ExpressionAttributeValues": serialize(values),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def _advance(self, request: AllocationRequest, old: int, new: int) -> dict[str, Any]:
        """The counter's ``SET`` from ``old`` to ``new`` (MRSC's ``gapless``), as an UpdateItem."""
        names = Names.of(request.rule.counter, request.rule.revision)
        counter = names[request.rule.counter]
        fenced = f"{counter} = :old" + (f" OR attribute_not_exists({counter})" if old == 0 else "")
        values = {":old": Decimal(old), ":new": Decimal(new)}
        return dict(self._set_counter(request, names, ":new", fenced, values)["Update"])

    def _put_absent(self, member: Mapping[str, Any]) -> dict[str, Any]:
        return self._on_key("Put", member, ReturnValuesOnConditionCheckFailure="ALL_OLD")

    def _guard(
        self,
        request: AllocationRequest,
        outcome: str,
        numbers: tuple[int, ...],
        members: list[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """The idempotency guard's Put for this round's transaction, if the call has a key."""
        if request.keyed is None:
            return []
        keys = [self.rules.key_of(member) for member in members]
        return [self.guards.put(request.keyed, outcome, numbers, keys)]

    def _collision(
        self, request: AllocationRequest, existing: Mapping[str, Any], number: int, attempt: int
    ) -> Allocation:
        """A member's put failed: a natural key already taken, or a counter behind members."""
        if isinstance(request.rule.members, IndexMembers):
            return self._existing(request, existing, number, wasted=(), retries=attempt - 1)
        raise CounterBehindError(request.counter_key, number)

    def _existing(
        self,
        request: AllocationRequest,
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
        if request.keyed and (
            record := self.guards.record(request.keyed, "already_present", numbers, [key])
        ):
            return self._replay(request.keyed, record)
        return Allocation(numbers, (key,), "already_present", retries, wasted)

    def _replay(self, keyed: Keyed, record: Record) -> Allocation:
        """What the key's first call got; numbers are handed out once, so no re-read."""
        self.guards.answer(keyed, record)
        outcome = cast(Literal["allocated", "already_present"], record.outcome)
        return Allocation(record.numbers, record.member_keys, outcome, replayed=True)
