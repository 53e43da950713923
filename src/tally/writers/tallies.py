"""Count and sum writers (seed 004): the child write and the counter bump in one transaction."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Literal

from tally.dynamodb import (
    Backoff,
    Cancelled,
    Names,
    client_request_token,
    deserialize,
    serialize,
    transact,
)
from tally.rules import CountRule, Key, RuleSet, SumRule, TableKeys
from tally.writers.errors import ParentNotFoundError
from tally.writers.transactions import number_or_none, retrying

Outcome = Literal["created", "already_present", "removed", "not_present", "changed", "unchanged"]
_Operation = Literal["add", "remove", "change"]
_DONE: dict[_Operation, Outcome] = {"add": "created", "remove": "removed", "change": "changed"}


@dataclass(frozen=True)
class WriteResult:
    """What a write did. ``replayed``: DynamoDB recognised the idempotency token and did nothing
    this time, because the same request already committed within the last 10 minutes."""

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
    for attribute in (rule.counter, rule.revision):
        if attribute is not None:
            guards.append(
                f"(attribute_not_exists({names[attribute]}) OR "
                f"attribute_type({names[attribute]}, :number))"
            )
    if rule.revision is not None:
        adds.append(f"{names[rule.revision]} :one")
    return {
        "Update": {
            "TableName": table,
            "Key": serialize(keys.typed(parent_key)),
            "UpdateExpression": "ADD " + ", ".join(adds),
            "ConditionExpression": " AND ".join(guards),
            "ExpressionAttributeNames": names.expression_names,
            "ExpressionAttributeValues": serialize(
                {":delta": delta, ":number": "N"} | ({":one": Decimal(1)} if rule.revision else {})
            ),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def raise_for_parent(cancelled: Cancelled, index: int, key: Key, *attributes: str | None) -> None:
    """Turn the parent's failed condition into ParentNotFound or InvalidCounter."""
    if not cancelled.failed(index):
        return
    old = cancelled.old_item(index)
    if old is None:
        raise ParentNotFoundError(key)
    for attribute in attributes:
        if attribute is not None:
            number_or_none(old, attribute, key)
    raise cancelled.unexpected()


class TallyWriter:
    """Adds, removes and changes children of count and sum rules, one transaction each."""

    def __init__(
        self, client: Any, table_name: str, rules: RuleSet, backoff: Backoff | None = None
    ):
        self.client = client
        self.table_name = table_name
        self.rules = rules
        self.backoff = backoff or Backoff()
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
        match = self.rules.child_match(key)
        rule = match.rule
        assert isinstance(rule, CountRule | SumRule)
        item = {**(attributes or {}), **key}
        delta = _amount(item, rule) if isinstance(rule, SumRule) else Decimal(1)
        names = Names.of(self._pk)
        child = {
            "Put": {
                "TableName": self.table_name,
                "Item": serialize(self._keys.typed(item)),
                "ConditionExpression": f"attribute_not_exists({names[self._pk]})",
                "ExpressionAttributeNames": names.expression_names,
            }
        }
        items = [child, parent_update(self.table_name, match.parent_key, rule, delta, self._keys)]
        try:
            return self._commit(items, "add", key, idempotency_key, item)
        except Cancelled as cancelled:
            raise_for_parent(cancelled, 1, match.parent_key, rule.counter, rule.revision)
            return WriteResult("already_present", attempts=cancelled.attempts)

    def remove_child(
        self, key: Mapping[str, str], *, idempotency_key: str | None = None
    ) -> WriteResult:
        """Delete the child if present and subtract 1 (count) or its amount (sum)."""
        match = self.rules.child_match(key)
        rule = match.rule
        assert isinstance(rule, CountRule | SumRule)
        if isinstance(rule, CountRule):
            return self._write_child(
                "remove", key, match.parent_key, rule, None, None, idempotency_key
            )
        return self._change_sum_child(key, match.parent_key, rule, None, idempotency_key)

    def change_amount(
        self, key: Mapping[str, str], amount: Decimal | int, *, idempotency_key: str | None = None
    ) -> WriteResult:
        """Set a sum child's amount and add the difference to the parent's total."""
        match = self.rules.child_match(key)
        rule = match.rule
        if not isinstance(rule, SumRule):
            raise ValueError(
                f"rule {rule.name!r} is a {rule.kind} rule: only sum children have amounts"
            )
        new = _amount({rule.summed: amount}, rule)
        return self._change_sum_child(key, match.parent_key, rule, new, idempotency_key)

    def _change_sum_child(
        self,
        key: Mapping[str, str],
        parent_key: Key,
        rule: SumRule,
        new: Decimal | None,
        idempotency_key: str | None,
    ) -> WriteResult:
        # Transactions cannot read, so read the amount first and fence the write on it.
        attempts = 0
        for attempt in retrying(self.backoff):
            attempts = attempt
            current = self._get(dict(key))
            if current is None:
                return WriteResult("not_present", attempts=attempt)
            old = number_or_none(current, rule.summed, dict(key)) or Decimal(0)
            if new is not None and new == old:
                return WriteResult("unchanged", attempts=attempt)
            operation: _Operation = "remove" if new is None else "change"
            try:
                return self._write_child(
                    operation, key, parent_key, rule, old, new, idempotency_key, attempt
                )
            except _AmountMoved:
                continue
        raise RuntimeError(f"child {dict(key)} kept changing over {attempts} attempts")

    def _write_child(
        self,
        operation: _Operation,
        key: Mapping[str, str],
        parent_key: Key,
        rule: CountRule | SumRule,
        old: Decimal | None,
        new: Decimal | None,
        idempotency_key: str | None,
        previous_attempts: int = 1,
    ) -> WriteResult:
        names = Names.of(self._pk, rule.summed if isinstance(rule, SumRule) else None)
        child: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": serialize(self._keys.typed(key)),
            "ExpressionAttributeNames": names.expression_names,
        }
        condition = f"attribute_exists({names[self._pk]})"
        if isinstance(rule, SumRule):
            summed = names[rule.summed]
            fence = f"{summed} = :old" + (f" OR attribute_not_exists({summed})" if old == 0 else "")
            condition = f"{condition} AND ({fence})"
            child["ExpressionAttributeValues"] = serialize(
                {":old": old} | ({":new": new} if new is not None else {})
            )
        child["ConditionExpression"] = condition
        if new is None:
            delta = -(old if old is not None else Decimal(1))
            entry = {"Delete": child}
        else:
            delta = new - (old or Decimal(0))
            assert isinstance(rule, SumRule)
            child["UpdateExpression"] = f"SET {names[rule.summed]} = :new"
            entry = {"Update": child}
        items = [entry, parent_update(self.table_name, parent_key, rule, delta, self._keys)]
        try:
            result = self._commit(items, operation, key, idempotency_key, {"old": old, "new": new})
        except Cancelled as cancelled:
            raise_for_parent(cancelled, 1, parent_key, rule.counter, rule.revision)
            if isinstance(rule, SumRule):
                raise _AmountMoved from None
            return WriteResult("not_present", attempts=cancelled.attempts)
        return replace(result, attempts=result.attempts + previous_attempts - 1)

    def _get(self, key: Key) -> dict[str, Any] | None:
        response = self.client.get_item(
            TableName=self.table_name, Key=serialize(self._keys.typed(key)), ConsistentRead=True
        )
        return deserialize(response["Item"]) if "Item" in response else None

    def _commit(
        self,
        items: list[dict[str, Any]],
        operation: _Operation,
        key: Mapping[str, str],
        idempotency_key: str | None,
        content: Any,
    ) -> WriteResult:
        """Run the transaction under its idempotency token and say what it did.

        A replay under the caller's key answers what the original request did. A replay under
        a derived token only proves that an identical request committed in the last 10
        minutes; the child's state decides whether this call is a duplicate, or a new
        request (like, unlike, like again) that must run under a fresh token.
        """
        basis = {"idempotency_key": idempotency_key} if idempotency_key else content
        token = client_request_token(operation, self.table_name, dict(key), basis)
        committed = transact(self.client, items, token, self.backoff)
        done = _DONE[operation]
        if not committed.replayed:
            return WriteResult(done, attempts=committed.attempts)
        if idempotency_key:
            return WriteResult(done, replayed=True, attempts=committed.attempts)
        present = self._get(dict(key)) is not None
        if present == (operation != "remove"):
            outcome: Outcome = "already_present" if present else "not_present"
            return WriteResult(outcome, replayed=True, attempts=committed.attempts)
        fresh = transact(self.client, items, str(uuid.uuid4()), self.backoff)
        return WriteResult(done, attempts=committed.attempts + fresh.attempts)


class _AmountMoved(Exception):
    """The sum child changed between our read and our fenced write."""


def _amount(item: Mapping[str, Any], rule: SumRule) -> Decimal:
    """The child's summed attribute as a Decimal; ValueError naming the field otherwise."""
    value = item.get(rule.summed)
    if isinstance(value, bool) or not isinstance(value, Decimal | int):
        kind = "missing" if value is None else type(value).__name__
        raise ValueError(
            f"field {rule.summed!r} of a {rule.name!r} child must be an int or Decimal, got {kind}"
        )
    amount = Decimal(value)
    if not amount.is_finite():
        raise ValueError(f"field {rule.summed!r} must be a finite number, got {amount}")
    return amount
