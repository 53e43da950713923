"""One layer owns each retry of a transaction, never both multiplied. botocore (standard
mode, ``max_attempts`` 5: six sends) resends a refused request: TransactionInProgressException,
the request throttled, 5xx. ``transact`` resends a cancellation whose every reason is
transient (TransactionConflict, ThrottlingError), ``Backoff.attempts`` times at most;
botocore never retries a TransactionCanceledException. Each case answers every attempt the
same way and counts what was sent (before: 16 x 6 = 96 sends for a token in progress)."""

from __future__ import annotations

import pytest

from tally.core.aws import client
from tally.core.dynamodb import Backoff, TransactionFailedError, transact
from tests.harness.faults import Refused

OURS, BOTOCORE = "transact", "botocore"
ITEMS = [{"Put": {"TableName": "t", "Item": {"PK": {"S": "a"}}}}]


def cancelled(*codes: str) -> dict[str, object]:
    return {"CancellationReasons": [{"Code": code, "Message": code} for code in codes]}


@pytest.mark.parametrize(
    ("code", "status", "fields", "layer"),
    [
        ("TransactionCanceledException", 400, cancelled("TransactionConflict", "None"), OURS),
        ("TransactionCanceledException", 400, cancelled("ThrottlingError"), OURS),
        ("TransactionCanceledException", 400, cancelled("ProvisionedThroughputExceeded"), OURS),
        ("TransactionInProgressException", 400, {}, BOTOCORE),
        ("ThrottlingException", 400, {}, BOTOCORE),
        ("ProvisionedThroughputExceededException", 400, {}, BOTOCORE),
        ("InternalServerError", 500, {}, BOTOCORE),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_transaction_refused_at_every_attempt_is_sent_by_one_layers_bound(
    code: str, status: int, fields: dict[str, object], layer: str
) -> None:
    dynamodb = client("dynamodb", endpoint_url="http://127.0.0.1:9")
    # botocore's total is the first attempt and max_attempts (5) retries.
    bounds = {OURS: Backoff.attempts, BOTOCORE: dynamodb.meta.config.retries["total_max_attempts"]}
    assert bounds == {OURS: 16, BOTOCORE: 6}
    refused = Refused(dynamodb, "TransactWriteItems", code, status, **fields)
    with refused, pytest.raises(TransactionFailedError):
        transact(dynamodb, ITEMS, "token", Backoff(base_seconds=0, cap_seconds=0))
    assert refused.attempts == bounds[layer]
