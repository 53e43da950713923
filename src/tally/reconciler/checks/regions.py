"""The reconciler on one Region of a Global Table (docs/global-tables.md, "The reconciler on
every Region"): what it reads of its own stream before the protocol's steps.

- **Losses of its own writes**, from every record (``protocol.regions.own_loss``): a child
  of this Region's that another Region's child replaced (a number handed out twice, a like
  made in two Regions) is alerted as ``overwritten``, with the lost child's payload, once a
  consistent read here shows it is still gone. Only the Region that lost it reads it so:
  one alert across the Regions. Never repaired: which child should hold the key is a human
  decision.
- **Parents homed elsewhere** are not this Region's to judge: their records leave the batch,
  so this Region never recounts, alerts or repairs them. Their home Region judges them
  only after replication had time to settle (``runtime.settled_rules``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tally.core.dynamodb import deserialize, serialize
from tally.core.regions import is_regional
from tally.reconciler.findings import Finding, Repair
from tally.reconciler.protocol.regions import GlobalMode, Loss, own_loss, still_lost
from tally.reconciler.report.reporter import Reporter
from tally.rules import RuleSet, SequenceRule

NEVER = "which of two children under one key should stay is a human decision"


class RegionLosses:
    def __init__(
        self,
        mode: GlobalMode,
        rules: RuleSet,
        client: Any,
        table_name: str,
        reporter: Reporter,
    ):
        self.mode = mode
        self._rules = rules
        self._client = client
        self._table = table_name
        self._reporter = reporter

    def homed_here(self, records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The records this Region judges: those of a parent homed here (and those no rule
        claims, which the protocol skips as ever)."""
        kept = []
        for record in records:
            keys = record.get("dynamodb", {}).get("Keys")
            try:
                matches = self._rules.classify(deserialize(keys)) if keys else []
            except (TypeError, ValueError, AttributeError):
                matches = []
            parents = [m.parent_key for m in matches if m.parent_key is not None]
            if not parents or self.mode.homes_here(parents):
                kept.append(record)
        return kept

    def read_losses(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Alert each child of this Region's that another Region's replaced; how many."""
        alerted = 0
        for record in records:
            loss = self._loss(record)
            if loss is None or loss.kind != "child_overwritten":
                continue
            finding = self._finding(loss)
            if finding is not None:
                self._reporter.alert_unrepaired(finding)
                alerted += 1
        return alerted

    def _loss(self, record: Mapping[str, Any]) -> Loss | None:
        images = record.get("dynamodb", {})
        try:
            key = deserialize(images["Keys"])
            old = deserialize(images["OldImage"]) if "OldImage" in images else None
            new = deserialize(images["NewImage"]) if "NewImage" in images else None
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # a malformed record is the protocol's to count, not ours
        return own_loss(str(record.get("eventName")), key, old, new, self.mode.region)

    def _finding(self, loss: Loss) -> Finding | None:
        matches = [
            m for m in self._rules.classify(loss.key) if m.role in ("child", "member", "indexed")
        ]
        if not matches:
            return None  # not a child or member of any rule: nothing of ours was lost
        now = self._client.get_item(
            TableName=self._table, Key=_typed(self._rules, loss.key), ConsistentRead=True
        ).get("Item")
        if not still_lost(loss, deserialize(now) if now else None):
            return None  # the child is back: a newer version held it after all
        rule = matches[0].rule
        winner = {n: v for n, v in deserialize(now).items() if not is_regional(n)} if now else None
        if isinstance(rule, SequenceRule):
            what = f"number handed out twice in {rule.name!r}"
        else:
            what = f"a child of {rule.name!r} written in two Regions"
        detail = (
            f"{what}: this Region's child (id {loss.child_id}) was replaced by "
            f"{loss.winner or 'another Region'}'s under the same key; `stored` is the lost "
            "child, `actual` the one the key holds"
        )
        return Finding(
            "overwritten",
            rule.name,
            self._table,
            {k: str(v) for k, v in loss.key.items()},
            "tallyChildId",
            loss.lost_child,
            winner,
            detail=detail,
            repair=Repair("skipped", NEVER),
            region=self.mode.region,
        )


def _typed(rules: RuleSet, key: Mapping[str, Any]) -> dict[str, Any]:
    return serialize(rules.table.typed(key))
