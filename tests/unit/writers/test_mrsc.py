"""The MRSC writers' pure parts (``tally.writers.mrsc``): the mode's name, the attributes it
keeps for itself, the parent's ring of tokens, and the send loop's decisions, driven by a
fake client that answers as DynamoDB and botocore would."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError
from hypothesis import given
from hypothesis import strategies as st

from tally.core.dynamodb import Backoff
from tally.core.regions import writes
from tally.rules import DEFAULT_RULES_FILE, load_rules
from tally.writers.errors import InvalidRequestError
from tally.writers.mrsc import (
    CHANGED,
    CONFLICT,
    MARK,
    RING,
    StrongWrites,
    applied,
    check_consistency,
    refuse_marks,
    ringed,
)
from tally.writers.parents import parent_update
from tally.writers.regional import stamped_update

RULES = load_rules(DEFAULT_RULES_FILE)
POST = {"PK": "POST#1", "SK": "META"}
BACKOFF = Backoff(attempts=6, base_seconds=0, cap_seconds=0)
tokens = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)


@given(st.one_of(st.text(), st.none(), st.integers()))
def test_the_consistency_is_eventual_or_strong_and_nothing_else(value: Any) -> None:
    if value in ("eventual", "strong"):
        assert check_consistency(value) == value
    else:
        with pytest.raises(ValueError, match="consistency"):
            check_consistency(value)


@given(
    st.dictionaries(st.text(min_size=1), st.integers(), max_size=5),
    st.sampled_from([MARK, CHANGED, *RING]),
)
def test_a_caller_may_not_set_the_attributes_the_writers_keep(
    attributes: dict[str, Any], kept: str
) -> None:
    own = {k: v for k, v in attributes.items() if k not in (MARK, CHANGED, *RING)}
    refuse_marks(own, ("attributes",))  # anything else passes
    with pytest.raises(InvalidRequestError) as refused:
        refuse_marks({**own, kept: 1}, ("attributes",))
    assert refused.value.field == ("attributes", kept)


def like_update() -> dict[str, Any]:
    rule = RULES["likes"]
    return dict(parent_update("t", POST, rule, Decimal(1), RULES.table)["Update"])  # type: ignore[arg-type]


@given(tokens)
def test_the_counter_update_puts_the_token_first_in_the_ring_only_if_no_place_holds_it(
    token: str,
) -> None:
    update = like_update()
    out = ringed(update, token)
    expression = out["UpdateExpression"]
    names = out["ExpressionAttributeNames"]
    assert expression.startswith(update["UpdateExpression"] + " SET #ring0 = :ringToken")
    assert expression.count("SET") == 1
    for i in range(1, len(RING)):
        assert f"#ring{i} = if_not_exists(#ring{i - 1}, :ringNone)" in expression
    assert [names[f"#ring{i}"] for i in range(len(RING))] == list(RING)
    assert out["ConditionExpression"].startswith(f"({update['ConditionExpression']}) AND ")
    assert out["ConditionExpression"].count("<> :ringToken") == len(RING)
    assert out["ExpressionAttributeValues"][":ringToken"] == {"S": token}


def test_the_ring_joins_an_update_that_has_a_set_clause_and_keeps_the_regions_count() -> None:
    update = {**like_update(), "UpdateExpression": "ADD #a1 :delta SET #x = :one"}
    out = stamped_update(ringed(update, "abc"), "eu-west-1")
    assert out["UpdateExpression"].count("SET") == 1
    assert "#x = :one" in out["UpdateExpression"]
    assert "#tallyWrites :tallyOne" in out["UpdateExpression"]
    assert out["ExpressionAttributeNames"]["#tallyWrites"] == writes("eu-west-1")


@given(st.lists(tokens, max_size=len(RING)), tokens)
def test_a_write_is_applied_when_the_ring_holds_its_token(ring: list[str], token: str) -> None:
    parent = {**POST, **dict(zip(RING, ring, strict=False))}
    assert applied(parent, token) == (token in ring)
    assert not applied(None, token)


# --- the send loop --------------------------------------------------------------------------


def refused(code: str, status: int = 400, **extra: Any) -> ClientError:
    return ClientError(
        {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}, **extra},
        "UpdateItem",
    )


class Fake:
    """A client whose ``update_item`` answers from a script: ``ok``, ``failed`` (a condition),
    ``conflict``, ``lost`` (no answer), ``5xx``, ``invalid``."""

    def __init__(self, script: list[str]):
        self._script: Iterator[str] = iter(script)
        self.calls = 0

    def update_item(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        answer = next(self._script)
        if answer == "ok":
            return {"Attributes": {"likeTally": {"N": "1"}}}
        if answer == "failed":
            raise refused("ConditionalCheckFailedException", Item={"PK": {"S": "POST#1"}})
        if answer == "conflict":
            raise refused(CONFLICT)
        if answer == "5xx":
            raise refused("InternalServerError", 500)
        if answer == "invalid":
            raise refused("ValidationException")
        raise ReadTimeoutError(endpoint_url="fake")


def strong(client: Any) -> StrongWrites:
    return StrongWrites(client, "t", RULES.table, BACKOFF, None)


answers = st.sampled_from(["ok", "failed", "conflict", "lost", "5xx", "invalid"])


@given(st.lists(answers, min_size=BACKOFF.attempts, max_size=BACKOFF.attempts))
def test_a_write_is_sent_until_answered_within_the_budget_and_says_if_it_may_be_in_twice(
    script: list[str],
) -> None:
    """Refusals (conflict) and unknown ends (lost, 5xx) are sent again, at most
    ``Backoff.attempts`` times in all; a condition's failure and success end the loop; an
    invalid request is raised at once. ``resent`` is true exactly when an earlier send got no
    answer or a 5xx."""
    client = Fake(script)
    terminal = next(
        (i for i, a in enumerate(script) if a in ("ok", "failed", "invalid")), len(script)
    )
    if terminal == len(script) or script[terminal] == "invalid":
        with pytest.raises((ClientError, ReadTimeoutError)):
            strong(client).send("update_item", {})
        assert client.calls == min(terminal + 1, len(script))
        return
    sent = strong(client).send("update_item", {})
    assert client.calls == sent.sends == terminal + 1
    assert sent.ok == (script[terminal] == "ok")
    assert sent.resent == any(a in ("lost", "5xx") for a in script[:terminal])


def test_a_send_that_got_no_answer_is_not_sent_again_when_a_read_finds_it_applied() -> None:
    client = Fake(["lost", "ok"])
    sent = strong(client).send("update_item", {}, check=lambda: {"PK": "POST#1"})
    assert (client.calls, sent.ok, sent.item, sent.resent) == (1, True, {"PK": "POST#1"}, True)


def test_a_conflict_is_not_checked_it_wrote_nothing() -> None:
    def check() -> dict[str, Any]:
        raise AssertionError("a refusal needs no read")

    sent = strong(Fake(["conflict", "ok"])).send("update_item", {}, check)
    assert sent.ok and not sent.resent


def test_a_connection_closed_after_commit_is_an_unknown_end() -> None:
    class Closed(Fake):
        def update_item(self, **kwargs: Any) -> dict[str, Any]:
            if self.calls == 0:
                self.calls += 1
                raise ConnectionClosedError(endpoint_url="fake")
            return super().update_item(**kwargs)

    sent = strong(Closed(["failed"])).send("update_item", {})
    assert not sent.ok and sent.resent and sent.sends == 2
