"""A repair's own stream record whose marker cannot be looked up: folded as any write on a
table whose repairs commit in one transaction (a recount at worst); retried on MRSC, where
that record may be the only thing left to finish the repair (docs/verification.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from tally.reconciler.checks.batches import confirm_own_writes
from tally.reconciler.stats import StatsBook
from tally.reconciler.stream.grouping import group_records
from tally.rules import REPAIR_MARKER, load_rules
from tests.utils import stream_record

RULES = load_rules(Path(__file__).parents[2] / "integration" / "rules.toml")
POST = {"PK": "POST#a91f", "SK": "META"}


class Throttled:
    def confirm_marker(self, *_: Any) -> bool:
        error = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow"}}
        raise ClientError(error, "GetItem")  # type: ignore[arg-type]


def repair_record() -> dict[str, Any]:
    return stream_record("MODIFY", POST, {"likeTally": 2, REPAIR_MARKER: "f1"}, {"likeTally": 9})


def test_an_unconfirmable_claim_is_folded_where_repairs_are_one_transaction() -> None:
    batch = group_records([repair_record()], RULES)
    confirmed, retry = confirm_own_writes(batch, RULES, Throttled(), StatsBook(), None)  # type: ignore[arg-type]
    assert confirmed == [] and len(batch.groups) == 1  # judged as an ordinary write
    assert retry == []


def test_an_unconfirmable_claim_is_retried_where_repairs_are_written_apart() -> None:
    record = repair_record()
    batch = group_records([record], RULES)
    confirmed, retry = confirm_own_writes(batch, RULES, Throttled(), StatsBook(), None, 1, True)  # type: ignore[arg-type]
    assert confirmed == [] and batch.groups == {}
    assert retry == [record["dynamodb"]["SequenceNumber"]]


class Client:
    def __init__(self, code: str | None):
        self.code = code
        self.puts = 0

    def put_item(self, **_: Any) -> dict[str, Any]:
        self.puts += 1
        if self.code:
            raise ClientError({"Error": {"Code": self.code, "Message": "no"}}, "PutItem")  # type: ignore[arg-type]
        return {}


def test_a_markers_record_put_again_after_a_lost_answer_is_no_failure() -> None:
    from tally.reconciler.store.log import FindingLog

    log = FindingLog(Client("ConditionalCheckFailedException"), "audit")
    log.put_marker(log.marker_put("r:ab12", POST))  # the resend found its own put: fine
    throttled = FindingLog(Client("ProvisionedThroughputExceededException"), "audit")
    try:
        throttled.put_marker(throttled.marker_put("r:ab12", POST))
    except ClientError:
        pass
    else:
        raise AssertionError("any other error still stops the repair before its write")
