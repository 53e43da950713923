"""Count and sum writers (seed 004): the child write and the counter bump in one transaction.

Every call reports what it did. Each transaction carries a fresh ``ClientRequestToken``:
botocore's retry of it after a lost response is a replay of the same commit, and a repeated
call is a new request (like, unlike, like again all count). Under an idempotency key a guard
item in the same transaction remembers the outcome (``tally.writers.idempotency``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal, localcontext
from typing import Any, Literal, cast

from botocore.exceptions import ClientError

from tally.dynamodb import (
    Backoff,
    Cancelled,
    Names,
    TransactionFailedError,
    deserialize,
    serialize,
    transact,
)
from tally.rules import CountRule, Key, Match, RuleSet, SumRule, TableKeys
from tally.writers import items
from tally.writers.errors import (
    Field,
    IdempotencyConflictError,
    InvalidRequestError,
    ParentNotFoundError,
)
from tally.writers.idempotency import Guards, Keyed, Record
from tally.writers.reserved import refuse_reserved, reserved_attributes
from tally.writers.transactions import new_token, number_or_none, retrying

Outcome = Literal["created", "already_present", "removed", "not_present", "changed", "unchanged"]
_Operation = Literal["add", "remove", "change"]
_DONE: dict[_Operation, Outcome] = {"add": "created", "remove": "removed", "change": "changed"}
# Exact differences of two DynamoDB numbers (exponents -168..125) fit in 300 digits.
_EXACT = Context(prec=300)


@dataclass(frozen=True)
class WriteResult:
    """What a write did. ``replayed``: this call wrote nothing; it answers with the outcome an
    earlier call under the same idempotency key got."""

    outcome: Outcome
    replayed: bool = False
    attempts: int = 1


def parent_update(
    table: str,
    parent_key: Key,
    rule: CountRule | SumRule,
    delta: Decimal,
    keys: TableKeys,
) -> dict[str, Any]:
    """ADD delta to the counter and 1 to the revision, only on an existing, numeric parent."""
    partition_key = keys.partition_key
    names = Names.of(partition_key, rule.counter, rule.revision)
    adds = [f"{names[rule.counter]} :delta"]
    guards = [f"attribute_exists({names[partition_key]})"]
    values: dict[str, Any] = {":delta": delta, ":number": "N"}
    for attribute in (rule.counter, rule.revision):
        if attribute is not None:
            guards.append(
                f"(attribute_not_exists({names[attribute]}) OR "
                f"attribute_type({names[attribute]}, :number))"
            )
    if isinstance(rule, SumRule):
        # The new total must stay readable: from these bounds, adding delta cannot leave it.
        guards.append(
            f"(attribute_not_exists({names[rule.counter]}) OR "
            f"{names[rule.counter]} BETWEEN :low AND :high)"
        )
        with localcontext(Context(prec=items.MAX_DIGITS, rounding=ROUND_CEILING)):
            values[":low"] = -items.LARGEST - delta
        with localcontext(Context(prec=items.MAX_DIGITS, rounding=ROUND_FLOOR)):
            values[":high"] = items.LARGEST - delta
    if rule.revision is not None:
        adds.append(f"{names[rule.revision]} :one")
        values[":one"] = Decimal(1)
    return {
        "Update": {
            "TableName": table,
            "Key": serialize(keys.typed(parent_key)),
            "UpdateExpression": "ADD " + ", ".join(adds),
            "ConditionExpression": " AND ".join(guards),
            "ExpressionAttributeNames": names.expression_names,
            "ExpressionAttributeValues": serialize(values),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def raise_for_parent(
    cancelled: Cancelled,
    index: int,
    key: Key,
    *attributes: str | None,
    out_of_range: Exception | None = None,
) -> None:
    """Turn the parent's failed condition into ParentNotFound or InvalidCounter, or, when its
    numbers are fine, ``out_of_range`` (a sum's total would leave the readable range)."""
    if not cancelled.failed(index):
        return
    old = cancelled.old_item(index)
    if old is None:
        raise ParentNotFoundError(key)
    for attribute in attributes:
        if attribute is not None:
            number_or_none(old, attribute, key)
    raise out_of_range or cancelled.unexpected()


@dataclass(frozen=True)
class _Write:
    """One call: its target, its key's request, and (change) the amount it sets."""

    operation: _Operation
    key: Key
    parent_key: Key
    rule: CountRule | SumRule
    keyed: Keyed | None
    new: Decimal | None = None


class TallyWriter:
    """Adds, removes and changes children of count and sum rules, one transaction each."""

    def __init__(
        self, client: Any, table_name: str, rules: RuleSet, backoff: Backoff | None = None
    ):
        self.client = client
        self.table_name = table_name
        self.rules = rules
        self.backoff = backoff or Backoff()
        self.guards = Guards(client, table_name, rules, self.backoff)
        self._keys = rules.table
        self._pk = rules.table.partition_key

    def add_child(
        self,
        key: Mapping[str, str],
        attributes: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> WriteResult:
        """Put the child if absent and add 1 (count) or its amount (sum) to the parent."""
        match = self._match(key)
        rule = match.rule
        assert isinstance(rule, CountRule | SumRule)
        item = self._child_item(rule, key, attributes or {})
        keyed = self.guards.request(idempotency_key, "add", key, item)
        write = _Write("add", dict(key), match.parent_key, rule, keyed)
        delta = item[rule.summed] if isinstance(rule, SumRule) else Decimal(1)
        names = Names.of(self._pk)
        child = {
            "Put": {
                "TableName": self.table_name,
                "Item": serialize(self._keys.typed(item)),
                "ConditionExpression": f"attribute_not_exists({names[self._pk]})",
                "ExpressionAttributeNames": names.expression_names,
            }
        }
        parent = parent_update(self.table_name, match.parent_key, rule, delta, self._keys)
        amount = ("attributes", rule.summed) if isinstance(rule, SumRule) else None
        try:
            return self._commit(write, [child, parent], amount)
        except Cancelled as cancelled:
            return self._settle(write, "already_present", cancelled.attempts)

    def remove_child(
        self, key: Mapping[str, str], *, idempotency_key: str | None = None
    ) -> WriteResult:
        """Delete the child if present and subtract 1 (count) or its amount (sum)."""
        match = self._match(key)
        rule = match.rule
        assert isinstance(rule, CountRule | SumRule)
        keyed = self.guards.request(idempotency_key, "remove", key)
        write = _Write("remove", dict(key), match.parent_key, rule, keyed)
        if isinstance(rule, SumRule):
            return self._change_sum_child(write, ("key",))
        names = Names.of(self._pk)
        child = {
            "Delete": {
                "TableName": self.table_name,
                "Key": serialize(self._keys.typed(key)),
                "ConditionExpression": f"attribute_exists({names[self._pk]})",
                "ExpressionAttributeNames": names.expression_names,
            }
        }
        parent = parent_update(self.table_name, match.parent_key, rule, Decimal(-1), self._keys)
        try:
            return self._commit(write, [child, parent], None)
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
        new = items.number(amount, ("amount",))
        keyed = self.guards.request(idempotency_key, "change", key, new)
        write = _Write("change", dict(key), match.parent_key, rule, keyed, new)
        return self._change_sum_child(write, ("amount",))

    # --- requests -----------------------------------------------------------------------

    def _match(self, key: Mapping[str, Any]) -> Match:
        try:
            match = self.rules.child_match(key)
        except ValueError as error:
            raise InvalidRequestError(("key",), str(error)) from None
        items.check_key(key, self.rules.table, ("key",))
        return match

    def _child_item(
        self,
        rule: CountRule | SumRule,
        key: Mapping[str, str],
        attributes: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The child as it will be stored; refused, naming the field, if DynamoDB or the rules
        would refuse it."""
        field: Field = ("attributes",)
        values = items.attributes(attributes, field)
        refuse_reserved(values, reserved_attributes(self.rules, rule), field)
        if isinstance(rule, SumRule):
            amount: Field = (*field, rule.summed)
            if rule.summed not in values:
                raise InvalidRequestError(amount, f"a {rule.name!r} child needs its amount")
            values[rule.summed] = items.number(values[rule.summed], amount)
        item = {**values, **key}
        items.check_size(item, field)
        return item

    # --- committing ---------------------------------------------------------------------

    def _commit(
        self, write: _Write, writes: list[dict[str, Any]], amount: Field | None
    ) -> WriteResult:
        """Commit the writes (and the key's guard); ``Cancelled`` when the child's condition
        failed, which the caller turns into its outcome."""
        done = _DONE[write.operation]
        guard = [self.guards.put(write.keyed, done)] if write.keyed else []
        try:
            committed = transact(self.client, [*writes, *guard], new_token(), self.backoff)
        except Cancelled as cancelled:
            if write.keyed and (record := self.guards.taken(cancelled, len(writes))):
                return self._replay(write, record)
            rule = write.rule
            beyond = None
            if amount is not None:
                message = f"the parent's {rule.counter!r} would pass ±{items.LARGEST}"
                beyond = InvalidRequestError(amount, message)
            raise_for_parent(
                cancelled, 1, write.parent_key, rule.counter, rule.revision, out_of_range=beyond
            )
            raise
        except TransactionFailedError as failed:
            refusal = _number_refusal(failed)
            if amount is None or refusal is None:
                raise
            raise InvalidRequestError(
                amount, f"the parent's {write.rule.counter!r} cannot take it: {refusal}"
            ) from failed
        return WriteResult(done, attempts=committed.attempts)

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

    # --- sum children -------------------------------------------------------------------

    def _change_sum_child(self, write: _Write, field: Field) -> WriteResult:
        # Transactions cannot read, so read the amount first and fence the write on it.
        rule = write.rule
        assert isinstance(rule, SumRule)
        attempts = 0
        for attempt in retrying(self.backoff):
            attempts = attempt
            current = self._get(write.key)
            if current is None:
                return self._settle(write, "not_present", attempt)
            old = number_or_none(current, rule.summed, write.key) or Decimal(0)
            if write.new == old:
                return self._settle(write, "unchanged", attempt)
            if write.new is not None:
                items.check_size({**current, rule.summed: write.new}, ("amount",))
            try:
                result = self._commit(write, self._sum_writes(write, rule, old), field)
            except Cancelled:
                continue  # the amount moved between our read and our write
            return replace(result, attempts=result.attempts + attempt - 1)
        raise RuntimeError(f"child {write.key} kept changing over {attempts} attempts")

    def _sum_writes(self, write: _Write, rule: SumRule, old: Decimal) -> list[dict[str, Any]]:
        names = Names.of(self._pk, rule.summed)
        summed = names[rule.summed]
        fence = f"{summed} = :old" + (f" OR attribute_not_exists({summed})" if old == 0 else "")
        child: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": serialize(self._keys.typed(write.key)),
            "ConditionExpression": f"attribute_exists({names[self._pk]}) AND ({fence})",
            "ExpressionAttributeNames": names.expression_names,
        }
        values: dict[str, Any] = {":old": old}
        if write.new is None:
            delta, entry = -old, {"Delete": child}
        else:
            delta = _difference(write.new, old)
            child["UpdateExpression"] = f"SET {summed} = :new"
            values[":new"] = write.new
            entry = {"Update": child}
        child["ExpressionAttributeValues"] = serialize(values)
        return [entry, parent_update(self.table_name, write.parent_key, rule, delta, self._keys)]

    def _get(self, key: Key) -> dict[str, Any] | None:
        response = self.client.get_item(
            TableName=self.table_name, Key=serialize(self._keys.typed(key)), ConsistentRead=True
        )
        return deserialize(response["Item"]) if "Item" in response else None


def _still_holds(write: _Write, outcome: str, item: Mapping[str, Any] | None) -> bool:
    """Whether the child is still as the key's request left it."""
    if outcome in ("removed", "not_present"):
        return item is None
    if item is None:
        return False
    if write.operation != "change" or not isinstance(write.rule, SumRule):
        return True
    return bool(item.get(write.rule.summed) == write.new)


def _difference(new: Decimal, old: Decimal) -> Decimal:
    with localcontext(_EXACT):
        delta = new - old
    try:
        return items.number(delta, ("amount",))
    except InvalidRequestError:
        raise InvalidRequestError(
            ("amount",),
            f"changing {old} to {new} moves the total by {delta}, "
            "more digits than DynamoDB can add in one number",
        ) from None


def _number_refusal(failed: TransactionFailedError) -> str | None:
    """DynamoDB's message when it refused a number the transaction would store."""
    messages = [str(reason.get("Message", "")) for reason in failed.reasons]
    if isinstance(failed.__cause__, ClientError):
        messages.append(str(failed.__cause__.response.get("Error", {}).get("Message", "")))
    for message in messages:
        if "number" in message.lower() or "precision" in message.lower():
            return message
    return None
