"""Count and sum writers (reference counts): the child write and the counter bump in one
transaction.

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

from tally.core.dynamodb import (
    Backoff,
    Cancelled,
    Names,
    TransactionFailedError,
    serialize,
    transact,
)
from tally.rules import CountRule, Key, Match, RuleSet, SumRule, TableKeys
from tally.writers import items
from tally.writers.errors import (
    Field,
    IdempotencyConflictError,
    InvalidCounterError,
    InvalidRequestError,
    ParentNotFoundError,
)
from tally.writers.idempotency import Guards, Keyed, Record
from tally.writers.reserved import refuse_reserved, reserved_attributes
from tally.writers.transactions import (
    REVISION_LIMIT,
    new_token,
    number_or_none,
    old_item,
    read_item,
    retrying,
    revision_guard,
)

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


def total_limit(rule: CountRule | SumRule) -> Decimal:
    """The largest counter a writer adds to: 38 digits, ``scale`` of them decimal places."""
    scale = rule.scale if isinstance(rule, SumRule) else 0
    return Decimal((0, (9,) * items.MAX_DIGITS, -scale))


def parent_update(
    table: str,
    parent_key: Key,
    rule: CountRule | SumRule,
    delta: Decimal,
    keys: TableKeys,
) -> dict[str, Any]:
    """ADD delta to the counter and 1 to the revision, only on an existing parent whose
    counter and revision are numbers that stay exact after the ADD (every check in the
    update's own condition, so a refusal writes nothing)."""
    partition_key = keys.partition_key
    names = Names.of(partition_key, rule.counter, rule.revision)
    counter = names[rule.counter]
    adds = [f"{counter} :delta"]
    limit = total_limit(rule)
    # From these bounds (a number compares false with any other type), adding delta cannot
    # leave ±limit. Rounded inwards to the 38 digits an expression value may have.
    guards = [
        f"attribute_exists({names[partition_key]})",
        f"(attribute_not_exists({counter}) OR {counter} BETWEEN :low AND :high)",
    ]
    values: dict[str, Any] = {":delta": delta}
    with localcontext(Context(prec=items.MAX_DIGITS, rounding=ROUND_CEILING)):
        values[":low"] = -limit - delta
    with localcontext(Context(prec=items.MAX_DIGITS, rounding=ROUND_FLOOR)):
        values[":high"] = limit - delta
    revision, revision_values = revision_guard(names, rule.revision)
    guards += revision
    values |= revision_values
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


def judge_parent(
    parent: Mapping[str, Any] | None, key: Key, rule: CountRule | SumRule
) -> Mapping[str, Any]:
    """The parent, after ParentNotFound or InvalidCounter for what a writer cannot add to."""
    if parent is None:
        raise ParentNotFoundError(key)
    scale = rule.scale if isinstance(rule, SumRule) else 0
    number_or_none(parent, rule.counter, key, limit=total_limit(rule), scale=scale)
    if rule.revision is not None:
        number_or_none(parent, rule.revision, key, limit=REVISION_LIMIT, scale=0)
    return parent


def raise_for_parent(
    cancelled: Cancelled,
    index: int,
    key: Key,
    rule: CountRule | SumRule,
    delta: Decimal,
    out_of_range: Exception | None = None,
) -> None:
    """Turn the parent's failed condition into ParentNotFound or InvalidCounter, or, when its
    numbers are fine, ``out_of_range`` (a sum's total would leave the range it keeps)."""
    if not cancelled.failed(index):
        return
    parent = judge_parent(old_item(cancelled, index), key, rule)
    if out_of_range is not None:
        raise out_of_range
    value = parent.get(rule.counter)
    raise InvalidCounterError(
        key, rule.counter, value, f"holds {value}: adding {delta} would pass ±{total_limit(rule)}"
    )


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
            return self._commit(write, [child, parent], amount, delta)
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
            return self._commit(write, [child, parent], None, Decimal(-1))
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
            values[rule.summed] = in_domain(values[rule.summed], rule, amount)
        item = {**values, **key}
        items.check_size(item, field)
        return item

    # --- committing ---------------------------------------------------------------------

    def _commit(
        self, write: _Write, writes: list[dict[str, Any]], amount: Field | None, delta: Decimal
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
                message = f"the parent's {rule.counter!r} would pass ±{total_limit(rule)}"
                beyond = InvalidRequestError(amount, message)
            raise_for_parent(cancelled, 1, write.parent_key, rule, delta, out_of_range=beyond)
            raise
        except TransactionFailedError as failed:
            refusal = _number_refusal(failed)
            if refusal is None:
                raise
            # DynamoDB refused a number: find out whose, reading the parent (nothing written).
            judge_parent(self._get(write.parent_key), write.parent_key, write.rule)
            if amount is None:
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
                writes, delta = self._sum_writes(write, rule, old)
                result = self._commit(write, writes, field, delta)
            except Cancelled:
                continue  # the amount moved between our read and our write
            return replace(result, attempts=result.attempts + attempt - 1)
        raise RuntimeError(f"child {write.key} kept changing over {attempts} attempts")

    def _sum_writes(
        self, write: _Write, rule: SumRule, old: Decimal
    ) -> tuple[list[dict[str, Any]], Decimal]:
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
        parent = parent_update(self.table_name, write.parent_key, rule, delta, self._keys)
        return [entry, parent], delta

    def _get(self, key: Key) -> dict[str, Any] | None:
        response = self.client.get_item(
            TableName=self.table_name, Key=serialize(self._keys.typed(key)), ConsistentRead=True
        )
        return read_item(response.get("Item"))


def in_domain(value: Any, rule: SumRule, field: Field) -> Decimal:
    """The amount as stored, or a refusal naming the field and the rule's amount domain."""
    amount = items.number(value, field)
    exponent = amount.as_tuple().exponent
    assert isinstance(exponent, int)
    if -exponent > rule.scale or amount.copy_abs() > rule.max_amount:
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
