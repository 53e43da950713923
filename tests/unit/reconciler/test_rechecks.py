"""Rechecks: SQS round trip, delay clamping, and bodies that name the bad field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws

from tally.reconciler.report.rechecks import Recheck, RecheckQueue, merge_index_looks, parse_recheck

RECHECK = Recheck(
    rule="issues",
    key={"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"},
    counter_seen=42,
    reason="unbalanced",
)
QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/rechecks"


@pytest.fixture
def sqs() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("sqs")


def test_a_scheduled_recheck_comes_back_as_itself(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="rechecks")["QueueUrl"]
    RecheckQueue(sqs, url).schedule(RECHECK, 0)

    [message] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert parse_recheck(message["Body"]) == RECHECK


def test_an_aggregated_counters_observation_comes_back_with_it(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="rechecks")["QueueUrl"]
    observed = Recheck("carts", {"PK": "CART#1", "SK": "TOTAL"}, 0, "off", (None, "3.50"))
    RecheckQueue(sqs, url).schedule(observed, 0)

    [message] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert parse_recheck(message["Body"]) == observed


@given(
    stored=st.none() | st.decimals(allow_nan=False, allow_infinity=False).map(str),
    actual=st.decimals(allow_nan=False, allow_infinity=False).map(str),
    seen=st.integers(min_value=0, max_value=2**63),
)
def test_any_recheck_survives_its_message_body(stored: str | None, actual: str, seen: int) -> None:
    recheck = Recheck("carts", {"PK": "CART#1", "SK": "TOTAL"}, seen, "off", (stored, actual))
    assert parse_recheck(json.dumps(asdict(recheck))) == recheck


def test_a_delayed_recheck_is_not_visible_yet(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="rechecks")["QueueUrl"]
    RecheckQueue(sqs, url).schedule(RECHECK, 60)

    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []


@pytest.mark.parametrize(("asked", "sent"), [(-5, 0), (0, 0), (300, 300), (900, 900), (3600, 900)])
def test_the_delay_is_clamped_to_what_sqs_accepts(asked: int, sent: int) -> None:
    client = boto3.client("sqs")
    with Stubber(client) as stubber:
        stubber.add_response(
            "send_message",
            {"MessageId": "m1", "MD5OfMessageBody": "x"},
            {"QueueUrl": QUEUE_URL, "MessageBody": _body(), "DelaySeconds": sent},
        )
        RecheckQueue(client, QUEUE_URL).schedule(RECHECK, asked)
        stubber.assert_no_pending_responses()


def _body(**changes: Any) -> str:
    body: dict[str, Any] = {
        "rule": RECHECK.rule,
        "key": RECHECK.key,
        "counter_seen": RECHECK.counter_seen,
        "reason": RECHECK.reason,
        "carry_since": RECHECK.carry_since,
    }
    body |= changes
    return json.dumps({k: v for k, v in body.items() if v is not ...}, sort_keys=True)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_body(counter_seen=...), "counter_seen"),
        (_body(counter_seen="42"), "counter_seen"),
        (_body(counter_seen=-1), "counter_seen"),
        (_body(counter_seen=4.5), "counter_seen"),
        (_body(rule=""), "rule"),
        (_body(key={}), "key"),
        (_body(key={"PK": 7}), "key.PK"),
        (_body(reason=None), "reason"),
        (_body(surprise=True), "surprise"),
        (_body(observed=["3"]), "observed.1"),
        (_body(observed=[3, "4"]), "observed.0"),
        (_body(observed=["3", None]), "observed.1"),
        (_body(carry_since=-1), "carry_since"),
        (_body(carry_since="7"), "carry_since"),
    ],
)
def test_a_bad_body_names_the_field(body: str, field: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}: "):
        parse_recheck(body)


def test_a_body_that_is_not_json_says_so() -> None:
    with pytest.raises(ValueError, match="body: Invalid JSON"):
        parse_recheck("{not json")


# --- looks at a parent whose children are found through an index, merged per batch -----------

looks = st.lists(
    st.tuples(
        st.sampled_from(["followers", "likes"]),
        st.sampled_from(["USER#ann", "USER#bob"]),
        st.sampled_from([None, "1 1", "2 2"]),
        st.sampled_from([None, ("1", "1"), ("2", "1")]),
    ),
    max_size=12,
)


@settings(max_examples=1000)
@given(looks)
def test_looks_at_one_indexed_parent_in_one_batch_become_the_last_one(
    batch: list[tuple[str, str, str | None, tuple[str, str] | None]],
) -> None:
    rechecks = [
        (f"m{n}", Recheck(rule, {"PK": pk}, 0, "look", observed, reference=reference))
        for n, (rule, pk, reference, observed) in enumerate(batch)
    ]
    merged = merge_index_looks(rechecks, {"followers"})
    for rule, pk in {(rule, pk) for rule, pk, _, _ in batch}:
        same = [(m, r) for m, r in rechecks if (r.rule, r.key["PK"]) == (rule, pk)]
        if rule != "followers" or len(same) < 2:
            assert not any(m in merged for m, _ in same)  # taken as they are
            continue
        *answered, (last, look) = same
        assert all(merged[m] is None for m, _ in answered)
        taken = merged[last]
        assert taken is not None and (taken.rule, taken.key) == (look.rule, look.key)
        references = {r.reference for _, r in same}
        observations = {r.observed for _, r in same} - {None}
        assert taken.reference == (look.reference if len(references) == 1 else None)
        # What looks sent with one reference observed, if they agree (a look that observed
        # nothing takes nothing away).
        shared = len(references) == 1 and len(observations) == 1
        assert taken.observed == (next(iter(observations)) if shared else None)
