"""Property: whatever a stream batch holds, the real handler never raises and fails no record
unless I/O failed. Records are generated around the rules' key shapes, with forged values."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.handlers import reconciler as reconciler_handler
from tests.integration.conftest import Stack
from tests.utils import lambda_context

KEYS = st.sampled_from(
    [
        {"PK": "POST#f", "SK": "META"},
        {"PK": "POST#f", "SK": "LIKE#USER#1"},
        {"PK": "ORDER#f", "SK": "META"},
        {"PK": "ORDER#f", "SK": "LINE#1"},
        {"PK": "PROJECT#f", "SK": "COUNTER#ISSUE"},
        {"PK": "PROJECT#f", "SK": "ISSUE#0000000003"},
        {"PK": "PROJECT#f", "SK": "ISSUE#x"},
        {"PK": "UserMetadata", "SK": "META"},
        {"PK": "User#f", "SK": "PROFILE"},
        {"PK": "NOTE#f", "SK": "X"},
    ]
)
# Numbers no DynamoDB writer can store, next to ordinary ones.
NUMBERS = st.sampled_from(
    ["NaN", "sNaN", "Infinity", "-Infinity", "1e400", "1" * 39, "-5", "2.5", "0", "7", "1E+125"]
) | st.integers(-(10**6), 10**6).map(str)
VALUES = st.one_of(
    NUMBERS.map(lambda n: {"N": n}),
    st.text(max_size=8).map(lambda s: {"S": s}),
    st.just({"NULL": True}),
    st.just({"BOOL": True}),
    st.just({"M": {"email": {"S": "ann@example.com"}}}),
    st.just({"Q": "no such type"}),
    st.just("not an attribute value"),
)
ATTRIBUTES = st.sampled_from(
    [
        "likeTally",
        "tallyRevision",
        "total",
        "amount",
        "lastIssue",
        "LastID",
        "seqName",
        "NumIdentifier",
        "tallyRepair",
        "other",
    ]
)
IMAGES = st.none() | st.dictionaries(ATTRIBUTES, VALUES, max_size=4)


@st.composite
def records(draw: Any) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.none(), st.integers(), st.text(max_size=5), st.just([])))
    keys = draw(KEYS)
    stream: dict[str, Any] = {
        "Keys": {name: {"S": value} for name, value in keys.items()},
        "SequenceNumber": str(draw(st.integers(1, 10**20))),
        "ApproximateCreationDateTime": draw(
            st.one_of(st.integers(0, 2_000_000_000), st.just(10**20), st.just("soon"), st.none())
        ),
    }
    for image in ("NewImage", "OldImage"):
        value = draw(IMAGES)
        if value is not None:
            stream[image] = {**stream["Keys"], **value}
    record: dict[str, Any] = {
        "eventID": draw(st.text(max_size=6)),
        "eventName": draw(st.sampled_from(["INSERT", "MODIFY", "REMOVE", "BOGUS"])),
        "dynamodb": stream,
    }
    for field in draw(st.sets(st.sampled_from(["Keys", "SequenceNumber"]), max_size=1)):
        del stream[field]
    if draw(st.booleans()):
        record["userIdentity"] = draw(
            st.sampled_from(
                [{"type": "Service", "principalId": "dynamodb.amazonaws.com"}, "x", None]
            )
        )
    return record


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(records(), max_size=12))
def test_the_handler_never_raises_and_fails_nothing_without_io_failure(
    stack: Stack, batch: list[Any]
) -> None:
    response = reconciler_handler.handler({"Records": batch}, lambda_context())
    assert response == {"batchItemFailures": []}
