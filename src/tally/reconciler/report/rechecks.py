"""Rechecks: a parent or sequence to verify again later, through an SQS delay queue."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tally.reconciler.protocol import stamps
from tally.reconciler.protocol.lifecycle import Observed
from tally.rules import AnyRule, TallyRule

# SQS refuses a DelaySeconds outside 0..900 (15 minutes).
MAX_DELAY_SECONDS = 900


@dataclass(frozen=True)
class Recheck:
    """Verify ``rule`` on the parent or counter at ``key``; ``counter_seen`` bounds a gap check;
    ``carry_since`` names the carried remainder to recount (0: none), ``carry_through`` the
    last record it folded (0: not known), so a recheck that overtook its carry's write can
    tell it from one whose remainder was cancelled."""

    rule: str
    key: dict[str, str]
    counter_seen: int
    reason: str
    observed: Observed | None = None  # what an aggregated counter's last recount saw
    carry_since: int = 0
    # Sequences: the life of the counter item the horizon belongs to (the audit table counts
    # the removals of the counter item); a recheck from an earlier life judges no gap.
    epoch: int = 0
    carry_through: int = 0
    # Children found through an index: the parent's state (lifecycle.state_of) when the
    # batch or look that sent it here saw it; a look judges only a parent that held still.
    reference: str | None = None
    # Children found through an index: the looks this chain took at a parent that kept moving
    # (each waits twice as long as the last, up to SQS's 15 minutes).
    looks: int = 0
    # A Global Table of three Regions or more: a child of this Region's read as lost, judged
    # once replication settled (``checks.regions``): its id, the Region whose child replaced
    # it, and its attributes as JSON. ``key`` is then the child's.
    lost: dict[str, str] | None = None


class RecheckQueue:
    """Sends rechecks to the recheck queue."""

    def __init__(self, sqs_client: Any, queue_url: str):
        self.sqs = sqs_client
        self.queue_url = queue_url

    def schedule(self, recheck: Recheck, delay_seconds: int) -> None:
        """Deliver the recheck after ``delay_seconds``, clamped to what SQS allows."""
        body = asdict(recheck)
        if recheck.observed is None:
            del body["observed"]  # only aggregated counters carry one
        if not recheck.epoch:
            del body["epoch"]  # a sequence whose counter item was never removed
        if not recheck.carry_through:
            del body["carry_through"]
        if recheck.reference is None:
            del body["reference"]
        if not recheck.looks:
            del body["looks"]
        if recheck.lost is None:
            del body["lost"]
        self.sqs.send_message(
            QueueUrl=self.queue_url,
            MessageBody=json.dumps(body, sort_keys=True),
            DelaySeconds=max(0, min(MAX_DELAY_SECONDS, delay_seconds)),
        )


class _RecheckBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    rule: str = Field(min_length=1)
    key: dict[str, str] = Field(min_length=1)
    counter_seen: int = Field(ge=0)
    reason: str
    observed: tuple[str | None, str] | None = None
    carry_since: int = Field(default=0, ge=0)
    epoch: int = Field(default=0, ge=0)
    carry_through: int = Field(default=0, ge=0)
    reference: str | None = None
    looks: int = Field(default=0, ge=0)
    lost: dict[str, str] | None = None


def parse_recheck(body: str) -> Recheck:
    """The recheck in an SQS message body; ValueError naming the field when it is malformed."""
    try:
        parsed = _RecheckBody.model_validate_json(body)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'body'}: {e['msg']}"
            for e in error.errors()
        )
        raise ValueError(f"bad recheck message: {problems}") from error
    return Recheck(
        parsed.rule,
        parsed.key,
        parsed.counter_seen,
        parsed.reason,
        parsed.observed,
        parsed.carry_since,
        parsed.epoch,
        parsed.carry_through,
        parsed.reference,
        parsed.looks,
        parsed.lost,
    )


def mergeable(rules: Iterable[AnyRule]) -> frozenset[str]:
    """The rules whose looks ``merge_index_looks`` merges: children found through an index,
    kept by writers (a counter an aggregator keeps is judged a lag apart, unmerged)."""
    return frozenset(
        r.name for r in rules if isinstance(r, TallyRule) and r.through and r.lag_seconds is None
    )


def merge_index_looks(
    rechecks: Sequence[tuple[str, Recheck]], indexed: Collection[str]
) -> dict[str, Recheck | None]:
    """Looks at one parent of a rule whose children are found through an index (``indexed``:
    those rules' names), received together, made one: the last message takes the look, with
    the reference and observation they all share (None where they differ: the look then
    judges nothing and looks again); the others are answered by it (None). One look a grace
    after the latest change covers every earlier one. Other rechecks are left out."""
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[str, Recheck]]] = {}
    for message, recheck in rechecks:
        if recheck.rule in indexed and recheck.lost is None:
            groups.setdefault((recheck.rule, tuple(sorted(recheck.key.items()))), []).append(
                (message, recheck)
            )
    merged: dict[str, Recheck | None] = {}
    for looks in groups.values():
        if len(looks) < 2:
            continue
        *answered, (last, look) = looks
        merged |= {message: None for message, _ in answered}
        references = {recheck.reference for _, recheck in looks}
        stamped = {stamps.reference(r): r for r in references}
        if len(references) > 1 and None not in stamped:
            # Stamped references are each a grace old by now: the latest proves the most.
            latest = max((s for s in stamped if s is not None), key=lambda s: s.revision)
            references = {stamped[latest]}
        # Looks sent with one reference saw the parent in that one state: what they observed
        # agrees, or it is no observation to go on.
        observations = {recheck.observed for _, recheck in looks} - {None}
        shared = len(references) == 1 and len(observations) == 1
        merged[last] = replace(
            look,
            reference=references.pop() if len(references) == 1 else None,
            observed=observations.pop() if shared else None,
            looks=max(recheck.looks for _, recheck in looks),
        )
    return merged
