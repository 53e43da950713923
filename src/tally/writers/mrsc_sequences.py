"""``SequenceAllocator`` on an MRSC table (``tally.writers.mrsc``): numbers without a
transaction. A condition on MRSC sees every Region's writes, so of the writers that Put one
member only one succeeds: no number is handed out twice.

- ``atomic``: the counter's ``ADD`` (its marker recognises a resend, as on any table), then
  the member's conditional Put carrying the call's token. A crash between: a gap, as ever.
- ``gapless``: read the counter (n), Put member n+1 if absent, then ``SET`` the counter to
  n+1 conditioned on n. A Put that finds another writer's member: if the counter moved, start
  from it; if it still holds n, that writer is between its two writes (or crashed there), so
  move the counter on for it, conditioned on n, and try the next number. A crash between Put
  and ``SET`` leaves the counter one behind its members until the next allocation moves it
  on. (A counter reset behind its members, seed 003, is walked forward this way, where the
  transactional ``gapless`` raises ``CounterBehindError``.)

Refused on MRSC: ``sortkey`` and ``block`` (member and counter in one transaction), natural-key
members with ``gapless`` (a taken key there is the member, not a race), idempotency keys
(their guard rides in the request's transaction).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from botocore.exceptions import ClientError

from tally.core.dynamodb import deserialize
from tally.rules import IndexMembers
from tally.writers.allocations import AllocationRequest
from tally.writers.errors import InvalidRequestError, ParentHomedElsewhereError
from tally.writers.mrsc import CONFLICT, Sent, StrongWrites
from tally.writers.regional import homed_elsewhere, stamped_update
from tally.writers.transactions import read_item, retrying


def refuse(request: AllocationRequest, strategy: str, idempotency_key: str | None) -> None:
    if idempotency_key is not None:
        raise InvalidRequestError(
            ("idempotency_key",),
            "an idempotency key's guard is written in its request's transaction, which a "
            "multi-Region strongly consistent table refuses",
        )
    if strategy not in ("atomic", "gapless"):
        raise InvalidRequestError(
            ("strategy",),
            f"{strategy!r} writes its members and counter in one transaction, which a "
            "multi-Region strongly consistent table refuses: use 'atomic' or 'gapless'",
        )
    if strategy == "gapless" and isinstance(request.rule.members, IndexMembers):
        raise InvalidRequestError(
            ("strategy",),
            f"rule {request.rule.name!r} keys its members by a natural key: on a "
            "multi-Region strongly consistent table allocate them with 'atomic'",
        )


def update_counter(
    client: Any, region: str | None, strong: StrongWrites | None, update: Mapping[str, Any]
) -> Sent:
    """The atomic strategy's counter ``UpdateItem``: on MRSC sent as ``StrongWrites`` sends,
    elsewhere once (botocore's retries aside); a failed condition is an answer."""
    if strong is not None:
        return strong.update(update)
    if region is not None:
        update = stamped_update(update, region)
    try:
        response = client.update_item(**update)
    except ClientError as error:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        item = read_item(cast(dict[str, Any], error.response.get("Item")))
        if region is not None and (home := homed_elsewhere(item, region)):
            raise ParentHomedElsewhereError(deserialize(update["Key"]), home, region) from None
        return Sent(False, item, 1, False)
    return Sent(True, read_item(response["Attributes"]), 1, False)


def gapless(
    strong: StrongWrites,
    request: AllocationRequest,
    read_counter: Callable[[], int],
    set_counter: Callable[[int, int], dict[str, Any]],
    call: str,
) -> tuple[int, dict[str, Any], int]:
    """The number, its member and the rounds lost; ``set_counter(old, new)`` is the counter's
    ``SET`` conditioned on ``old``."""
    current = read_counter()
    for attempt in retrying(strong.backoff):
        number = current + 1
        member = request.member(strong.keys, number)
        if not strong.put_new(member, call).ok:
            counter = read_counter()
            if counter == current:
                strong.update(set_counter(current, number))  # the other writer's second step
                counter = number
            current = counter
            continue
        try:
            strong.update(set_counter(current, number))
        except ClientError as error:
            # The member is ours and no one else's; the next allocation moves the counter on.
            if error.response.get("Error", {}).get("Code") != CONFLICT:
                raise
        return number, member, attempt - 1
    raise RuntimeError(
        f"counter {request.counter_key} stayed contended for {strong.backoff.rounds} rounds"
    )
