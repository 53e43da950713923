"""The reconciler on one Region of a Global Table (docs/verification.md, "Global Tables"):
what it reads of its own stream before the protocol's steps.

- **Losses of its own writes**, from every record (``protocol.regions.own_loss``): a child
  of this Region's that another Region's child replaced (a number handed out twice, a like
  made in two Regions) is alerted as ``overwritten``, with the lost child's attributes, once a
  consistent read here shows it is still gone: at once between two Regions, a settle window
  later (a recheck) with three or more, where a newer version holding it may still come.
  Only the Region that lost it reads it so: one alert across the Regions. Never repaired:
  which child should hold the key is a human decision.
- **A contended parent** (``protocol.regions.contended``): before the home Region repairs a
  parent again, it counts the parent's repairs in its log; one repaired that often whose
  counters the Global Table's writers stamp is escalated (``contended``, critical, not repaired):
  route its writes to one Region or split its counter per Region.
- **The parents are the home Region's**: in any other Region the batch goes no further, so
  that Region never recounts, alerts or repairs a parent. The home Region judges them only
  after replication had time to settle (``protocol.regions.settled_rules``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from tally.core.dynamodb import deserialize, serialize
from tally.core.regions import CHILD_ID, ORIGIN, is_regional
from tally.reconciler.checks.links import ReplicationLinks
from tally.reconciler.findings import Finding, Repair
from tally.reconciler.protocol.regions import (
    CONTENDED_WINDOW_SECONDS,
    GlobalMode,
    Loss,
    contended,
    own_loss,
    still_lost,
)
from tally.reconciler.report.rechecks import Recheck
from tally.reconciler.report.reporter import Reporter
from tally.reconciler.store.log import FindingLog
from tally.reconciler.table.parent_reads import ParentReads
from tally.rules import AnyRule, Key, RuleSet, SequenceRule, TallyRule

NEVER = "which of two children under one key should stay is a human decision"
# The lost child's attributes ride in the alert (SNS takes 256 KB, an audit item 400 KB):
# past this size, its attribute names only.
MAX_PAYLOAD_CHARACTERS = 8_000


class RegionLosses:
    def __init__(
        self,
        mode: GlobalMode,
        rules: RuleSet,
        client: Any,
        table_name: str,
        reporter: Reporter,
        send: Callable[[Recheck, int], None] | None = None,
        links: ReplicationLinks | None = None,
    ):
        """``links``: this Region's replication links; with three Regions or more, a loss
        waits while one is behind (the child may still come back from the Region behind)."""
        self.mode = mode
        self._links = links
        self._rules = rules
        self._client = client
        self._table = table_name
        self._reporter = reporter
        self._send = send

    def homed_here(self, records: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The records this Region judges: all of them in the home Region, none elsewhere."""
        return records if self.mode.at_home else []

    def read_losses(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Alert each child of this Region's that another Region's replaced (with three
        Regions or more, once replication settled: see ``later``); how many now. On MRSC
        nothing is lost to replication (a write is everywhere when it is answered, and a
        condition sees every Region's writes): a child replaced there is an ordinary write."""
        if self.mode.strong:
            return 0
        alerted = 0
        for record in records:
            loss = self._loss(record)
            if loss is None or loss.kind != "child_overwritten":
                continue
            rule = self._child_rule(loss.key)
            if rule is None:
                continue  # not a child or member of any rule: nothing of ours was lost
            if self._send is not None and len(self.mode.regions) >= 3:
                self._send(self._later(rule, loss), self.mode.settle_seconds)
                continue
            finding = self._finding(rule, loss)
            if finding is not None:
                self._reporter.alert_unrepaired(finding)
                alerted += 1
        return alerted

    def judge_lost(self, recheck: Recheck) -> bool:
        """A loss read a settle window ago, judged against the child as it is now (alerted if
        still lost); whether it was. Between two Regions a child replaced is replaced for
        good (only the two of them write it); with a third, a newer version that holds it
        can still be on its way from the third, so the loss waits for replication to settle."""
        waiting = self._links.held(alert=self.mode.at_home) if self._links is not None else None
        if waiting and self._send is not None:
            self._send(replace(recheck, reason=f"held: {waiting}"), self.mode.settle_seconds)
            return False
        lost = recheck.lost or {}
        try:
            payload = json.loads(lost.get("payload", "{}"))
        except ValueError:
            payload = {}
        rule = self._child_rule(recheck.key)
        if rule is None or "child_id" not in lost:
            return False  # the rules changed since: not a child of any rule now
        key = self._rules.table.typed(recheck.key)
        loss = Loss(
            "child_overwritten",
            self.mode.region,
            key,
            lost.get("winner") or None,
            payload if isinstance(payload, dict) else {},
            lost["child_id"],
        )
        finding = self._finding(rule, loss)
        if finding is not None:
            self._reporter.alert_unrepaired(finding)
        return finding is not None

    def _later(self, rule: AnyRule, loss: Loss) -> Recheck:
        payload = json.dumps(_bounded(loss.lost_child or {}), default=str, sort_keys=True)
        return Recheck(
            rule.name,
            {k: str(v) for k, v in loss.key.items()},
            0,
            "a child of this Region's lost, judged once replication settled",
            lost={
                "child_id": str(loss.child_id),
                "winner": loss.winner or "",
                "payload": payload,
            },
        )

    def _child_rule(self, key: Mapping[str, Any]) -> AnyRule | None:
        matches = [m for m in self._rules.classify(key) if m.role in ("child", "member", "indexed")]
        return matches[0].rule if matches else None

    def _loss(self, record: Mapping[str, Any]) -> Loss | None:
        """The record's loss of ours, if any; a record that cannot be read is the protocol's
        to count as malformed, never a reason to fail the batch here."""
        try:
            images = record.get("dynamodb") or {}
            old = images.get("OldImage")
            if record.get("eventName") != "MODIFY" or not isinstance(old, Mapping):
                return None  # the cheap test first: only a MODIFY can replace a child
            mine = old.get(CHILD_ID, {}).get("S")
            if not isinstance(mine, str) or not mine.startswith(f"{self.mode.region}:"):
                return None
            key = deserialize(images["Keys"])
            new = deserialize(images["NewImage"])
            return own_loss("MODIFY", key, deserialize(old), new, self.mode.region)
        except Exception:  # a forged or damaged record: not ours to judge
            return None

    def _finding(self, rule: AnyRule, loss: Loss) -> Finding | None:
        key = serialize(self._rules.table.typed(loss.key))
        found = self._client.get_item(TableName=self._table, Key=key, ConsistentRead=True)
        now = deserialize(found["Item"]) if "Item" in found else None
        if not still_lost(loss, now):
            return None  # the child is back: a newer version held it after all
        what = (
            f"number handed out twice in {rule.name!r}"
            if isinstance(rule, SequenceRule)
            else f"a child of {rule.name!r} written twice under one key"
        )
        by = (
            f"{loss.winner}'s"
            if loss.winner
            else "one from a writer that leaves no Region (this Region's or another's)"
        )
        detail = (
            f"{what}: this Region's child (id {loss.child_id}) was replaced by {by}; "
            "`stored` is the lost child, `actual` the id and Region of the one the key holds"
        )
        # The state is the two children's ids: the same loss read again is the same finding,
        # and two children of this Region's lost under one key (the same attributes, the
        # same holder by the time they are read) are two: the lost one's id is the occurrence.
        holder = {"child_id": now.get(CHILD_ID), "region": now.get(ORIGIN)} if now else None
        return Finding(
            "overwritten",
            rule.name,
            self._table,
            {k: str(v) for k, v in loss.key.items()},
            CHILD_ID,
            _bounded(loss.lost_child or {}),
            holder,
            detail=detail,
            occurrence=str(loss.child_id),
            repair=Repair("skipped", NEVER),
            region=self.mode.region,
        )


class Contention:
    """The home Region's look, before a repair, at how often the parent was repaired."""

    def __init__(self, mode: GlobalMode, log: FindingLog, parents: ParentReads):
        self.mode = mode
        self._log = log
        self._parents = parents

    def escalated(self, rule: TallyRule, key: Key, finding: Finding) -> Finding | None:
        """The finding as ``contended`` when its parent is (then it is not repaired), else None.
        The parent is read only once the log shows enough repairs: a rare read. Never on
        MRSC, where no increment is lost to last writer wins, nor on a counter split per
        Region, whose shards each take one Region's writes only."""
        if self.mode.strong or rule.split is not None:
            return None
        since = self._log.clock() - CONTENDED_WINDOW_SECONDS
        repairs = self._log.repairs_since(rule.name, finding.key, since)
        if repairs < self.mode.contended_after:
            return None
        parent = self._parents.parent_item(key)
        regions = contended(parent, repairs, self.mode.contended_after)
        if not regions:
            return None
        detail = (
            f"repaired {repairs} times in {CONTENDED_WINDOW_SECONDS // 3600} h; its surviving "
            f"version holds writes from {', '.join(regions)}: its increments keep losing to "
            "last writer wins"
        )
        return replace(
            finding,
            kind="contended",
            detail="; ".join(p for p in (finding.detail, detail) if p),
            region=self.mode.region,
        )


ESCALATED = (
    "not repaired again: route this parent's writes to one Region (its home) or split its "
    "counter per Region (docs/global-tables.md)"
)


def _bounded(payload: Mapping[str, Any]) -> dict[str, Any]:
    shown = {n: v for n, v in payload.items() if not is_regional(n)}
    if len(json.dumps(shown, default=str)) <= MAX_PAYLOAD_CHARACTERS:
        return shown
    return {"attributes": sorted(shown), "note": "too large for an alert: its names only"}
