"""Writes for a multi-Region strongly consistent (MRSC) Global Table, ``consistency="strong"``.

MRSC refuses transactions, so a child and its counter are two writes, each one made safe to
send again:

- **Order.** Add: the child's conditional Put, then the counter's ``ADD``. Remove: the child's
  conditional Delete, then the ``ADD`` of minus its amount. A crash between the two leaves a
  counter **behind** its children after an add (a child it does not count) and **ahead** after
  a remove (a count of a child that is gone); never a count of a child that was not written.
  The reconciler recounts a parent from its children and repairs either.
- **Conflicts.** ``ReplicatedWriteConflictException`` (another Region is writing the item) is
  a refusal: nothing was written, so the same request is sent again after a full-jitter pause,
  ``Backoff.attempts`` sends at most. The writer owns these retries: botocore's standard mode
  would resend the conflict too (DynamoDB's model marks it retryable; legacy mode only on HTTP
  409), but never checks a lost answer before resending, so it is told not to for these writes.
- **Lost answers.** A send that got no answer (or a 5xx) may have committed. The writer sends
  it again (``Sent.resent`` then says an earlier send may have been written), and each write
  knows its own: each call draws a token (``MARK``) that the child's Put stores, so a resend
  refused by ``attribute_not_exists`` that finds our token found our child. The counter's
  ``ADD`` sets the token first in the parent's ring of the last ``len(RING)`` tokens,
  conditioned on it being in none of them; before resending it the writer reads the parent
  (a read is never refused by a conflict) and stops if the ring holds the token: applied,
  not counted twice.

A remove reads the child first and fences its Delete on the child's ``MARK`` as read (the
child it read, not one made since); its ``ADD`` carries that child's token (``MARK`` + ``-``),
not one of its own. So when two calls remove one child (one after a lost answer, finding it
gone, or both having read it), their decrements carry the same token: the ring applies one.

Why a ring on the parent and not a ``counted`` flag on the child: only the item that takes the
``ADD`` can fence it; a flag written before or after says nothing about a lost ``ADD``. Why a
ring and not the last token: on a busy parent other writers land between our lost answer and
our read (a thread may be paused). What remains: a counter write repeated after ``len(RING)``
other counter writes to the same parent since the first (a read that late, or a second
remover that slow) is applied again, and the counter is off by the delta until the
reconciler's recount repairs it. 16 tokens of 16 hex digits keep a small parent within one
1 KB write unit. A child written without ``MARK`` (by a writer not in this mode) is removed
under a fresh token. A change whose answer was lost and whose child another call changed
before the resend may go uncounted. A call whose answers were lost and that found the child
gone may say ``removed`` for another call's removal; the counter is still right.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

from tally.core.dynamodb import Backoff, serialize
from tally.rules import Key, TableKeys
from tally.writers.errors import Field, InvalidRequestError
from tally.writers.regional import stamped, stamped_update
from tally.writers.transactions import read_item

Consistency = Literal["eventual", "strong"]
CONSISTENCIES: tuple[Consistency, ...] = ("eventual", "strong")
CONFLICT = "ReplicatedWriteConflictException"
MARK = "tallyWrite"  # on a child or member: the token of the call that created it
CHANGED = "tallyChanged"  # on a sum child: the token of the call that last set its amount
RING = tuple(f"tallyApplied{i}" for i in range(16))  # on a parent: its last counter writes
# Refusals: nothing was written, the same request may be sent again after a pause.
REFUSALS = {
    CONFLICT,
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "TransactionConflictException",
}
_UNKNOWN = (ConnectionError, HTTPClientError)  # botocore's: the answer never came
_OWNER = threading.local()  # inside: this thread is in StrongWrites.send
_OWNED_HOOK = "tally.writers.mrsc.owned"
_SET = re.compile(r"(?<![#:\w.])SET\b", re.IGNORECASE)


def new_mark() -> str:
    """A call's token: 64 random bits, so two calls within a ring never share one."""
    return secrets.token_hex(8)


def check_consistency(consistency: object) -> Consistency:
    if consistency not in CONSISTENCIES:
        raise ValueError(f"consistency must be one of {CONSISTENCIES}, got {consistency!r}")
    return consistency


def refuse_marks(attributes: Mapping[str, Any], field: Field) -> None:
    """A caller's own token would pass a stranger's child off as ours after a lost answer."""
    for name in attributes:
        if name in (MARK, CHANGED) or name in RING:
            raise InvalidRequestError(
                (*field, name), f"is reserved: {name!r} is written by the writers on MRSC"
            )


def ringed(update: Mapping[str, Any], token: str) -> dict[str, Any]:
    """An ``UpdateItem`` request (``parents.parent_update``'s, or a counter's SET) that also
    puts ``token`` first in the parent's ring, shifting the others down (the oldest drops out),
    only if the token is in none of them. DynamoDB reads every operand as the item was before
    the update, so the shift needs no read."""
    out = dict(update)
    names = dict(out.get("ExpressionAttributeNames", {}))
    values = dict(out.get("ExpressionAttributeValues", {}))
    places = [f"#ring{i}" for i in range(len(RING))]
    names.update(zip(places, RING, strict=True))
    values |= serialize({":ringToken": token, ":ringNone": ""})
    shifts = [f"{places[0]} = :ringToken"] + [
        f"{places[i]} = if_not_exists({places[i - 1]}, :ringNone)" for i in range(1, len(places))
    ]
    fresh = " AND ".join(f"(attribute_not_exists({p}) OR {p} <> :ringToken)" for p in places)
    condition = out.get("ConditionExpression")
    expression = out["UpdateExpression"]
    if _SET.search(expression):
        expression = _SET.sub(f"SET {', '.join(shifts)},", expression, count=1)
    else:
        expression = f"{expression} SET {', '.join(shifts)}"
    out |= {
        "UpdateExpression": expression,
        "ConditionExpression": f"({condition}) AND {fresh}" if condition else fresh,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }
    return out


def applied(parent: Mapping[str, Any] | None, token: str) -> bool:
    """Whether the parent's ring holds the token: the write that carries it was applied."""
    return parent is not None and any(parent.get(name) == token for name in RING)


@dataclass(frozen=True)
class Sent:
    """One write's end. ``item``: the item as its failed condition found it (``ok`` False),
    or what its ``ReturnValues`` asked for; ``resent``: an earlier send of the same request
    may have committed; ``sends``: how many times the writer sent it (botocore does not resend
    these)."""

    ok: bool
    item: dict[str, Any] | None
    sends: int
    resent: bool


class StrongWrites:
    """One table's single-item writes on MRSC, every one stamped with the writer's Region when
    it has one (``tally.writers.regional``). The writer owns their retries: botocore's are
    turned off for them (a ``needs-retry`` hook that answers "no" inside ``send`` only), so
    that a resend after a lost answer can be checked first, and conflicts are retried once,
    not botocore's attempts times ours."""

    def __init__(
        self, client: Any, table_name: str, keys: TableKeys, backoff: Backoff, region: str | None
    ):
        self.client = client
        self.table_name = table_name
        self.keys = keys
        self.backoff = backoff
        self.region = region
        events = getattr(getattr(client, "meta", None), "events", None)
        if events is not None:
            events.register_first("needs-retry.dynamodb", _owned, unique_id=_OWNED_HOOK)

    def send(
        self,
        operation: str,
        request: Mapping[str, Any],
        check: Callable[[], dict[str, Any] | None] | None = None,
    ) -> Sent:
        """Send one write until it is answered; a failed condition is an answer (``ok`` False).

        A refusal (a conflict, throttling) is sent again after a full-jitter pause; a send
        that may have been written (no answer, a 5xx) is sent again at once, unless ``check``
        (a consistent read) finds it applied first: then the item it returns is the answer.
        """
        call: Callable[..., Any] = getattr(self.client, operation)
        maybe = False
        outer = getattr(_OWNER, "inside", False)  # a send within a send (a test's hook)
        for sends in range(1, self.backoff.attempts + 1):
            last = sends == self.backoff.attempts
            _OWNER.inside = True
            try:
                response = call(**request)
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code")
                status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400)
                if code == "ConditionalCheckFailedException":
                    item = read_item(cast(Mapping[str, Any] | None, error.response.get("Item")))
                    return Sent(False, item, sends, maybe)
                if code in REFUSALS and not last:
                    self.backoff.pause(sends)
                    continue
                if status < 500 or last:
                    raise
            except _UNKNOWN:
                if last:
                    raise
            else:
                return Sent(True, read_item(response.get("Attributes")), sends, maybe)
            finally:
                _OWNER.inside = outer
            maybe = True  # no answer, or a 5xx: it may have been written
            if check is not None and (item := check()) is not None:
                return Sent(True, item, sends, maybe)
        raise AssertionError("unreachable")  # pragma: no cover

    def put_new(
        self,
        item: Mapping[str, Any],
        token: str,
        check: Callable[[], dict[str, Any] | None] | None = None,
    ) -> Sent:
        """Put the item (with ``MARK``) where none has its key; ``ok`` also when the item
        there is ours (a resend after a lost answer), or when ``check`` says so."""
        names = {"#pk": self.keys.partition_key}
        put = {
            "TableName": self.table_name,
            "Item": serialize(self.keys.typed({**item, MARK: token})),
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": names,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if self.region is not None:
            put = stamped([{"Put": put}], self.region, fence_home=False)[0]["Put"]
        sent = self.send("put_item", put, check)
        if not sent.ok and sent.item is not None and sent.item.get(MARK) == token:
            return Sent(True, None, sent.sends, True)
        return sent

    def update(
        self,
        request: Mapping[str, Any],
        check: Callable[[], dict[str, Any] | None] | None = None,
    ) -> Sent:
        """An ``UpdateItem`` (a transaction's ``Update`` body), stamped."""
        if self.region is not None:
            request = stamped_update(request, self.region, fence_home=False)
        return self.send("update_item", {**request, "ReturnValues": "UPDATED_NEW"}, check)

    def delete(
        self,
        key: Key,
        condition: str = "attribute_exists(#pk)",
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> Sent:
        """Delete the item under ``key`` where ``condition`` holds (by default: it exists)."""
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": serialize(self.keys.typed(key)),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": dict(names or {"#pk": self.keys.partition_key}),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if values:
            request["ExpressionAttributeValues"] = serialize(values)
        return self.send("delete_item", request)

    def undo_put(self, key: Key, token: str) -> None:
        """Take back the item this call's ``put_new`` wrote (and nothing another call wrote)."""
        self.delete(key, "#mark = :mark", {"#mark": MARK}, {":mark": token})

    def get(self, key: Key) -> dict[str, Any] | None:
        response = self.client.get_item(
            TableName=self.table_name, Key=serialize(self.keys.typed(key)), ConsistentRead=True
        )
        return read_item(response.get("Item"))


def _owned(**_: Any) -> bool | None:
    """botocore's ``needs-retry``, first: "no" for a write ``StrongWrites.send`` is sending in
    this thread (it retries them itself), botocore's own answer for every other request."""
    return False if getattr(_OWNER, "inside", False) else None
