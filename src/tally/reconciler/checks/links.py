"""Replication links into a Global Table's Region (docs/global-tables.md, "Heartbeats"):
the heartbeats heard on this Region's stream and the lag measured on each; in the home
Region, the heartbeats its replica holds, and the hold on a settled finding while a link is
behind.

A settled imbalance is evidence only once replication from every other Region is live and
inside the settle window, measured: otherwise the writes a stalled link holds would arrive
after a repair (and lose to it), or a member on its way would be alerted as a gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from decimal import Decimal
from typing import Any

from tally.core.dynamodb import deserialize
from tally.core.regions import BEAT_AT, heartbeat, heartbeat_image
from tally.core.timefmt import epoch_iso
from tally.reconciler.findings import Finding, Repair
from tally.reconciler.protocol.regions import Behind, GlobalMode, links_behind
from tally.reconciler.report.reporter import Reporter
from tally.reconciler.stats import StatsBook
from tally.reconciler.store.links import Links
from tally.reconciler.table.heartbeats import Heartbeats

HELD = "a settled finding waits while replication from another Region is behind"
RULE = "replication"  # what a stalled link's finding names as its rule: it is no rule's


class ReplicationLinks:
    """This Region's links: heard from its stream, judged before a settled finding acts."""

    def __init__(
        self,
        mode: GlobalMode,
        beats: Heartbeats | None,
        links: Links,
        reporter: Reporter,
        book: StatsBook,
        table_name: str,
        clock: Callable[[], float] = time.time,
    ):
        self.mode = mode
        self._beats = beats
        self._links = links
        self._reporter = reporter
        self._book = book
        self._table = table_name
        self._clock = clock
        # Judged at most once a heartbeat interval in an invocation (a long audit sleeps).
        self._behind: tuple[float, list[Behind]] | None = None
        self._alerted: set[str] = set()  # links alerted stalled by this invocation

    def hear(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Note each heartbeat of another Region's in ``records``; how many. A record that
        cannot be read is not one (the protocol counts it as it would any other)."""
        heard = 0
        for record in records:
            beat = _beat(record)
            if beat is None or beat[0] == self.mode.region or beat[0] not in self.mode.regions:
                continue
            source, beat_at, arrived = beat
            arrived_at = arrived if arrived is not None else Decimal(str(self._clock()))
            if self._links.heard(source, beat_at, arrived_at):
                lag = max(Decimal(0), arrived_at - beat_at)
                self._book().replication_lags.append((source, float(lag)))
                heard += 1
        if heard:
            self._behind = None
        return heard

    def behind(self) -> list[Behind]:
        """The links a settled finding cannot wait out now. None on MRSC (a write is in every
        Region when it is answered), nor on a table whose keys cannot hold a heartbeat (its
        Regions never beat: documented, docs/global-tables.md)."""
        if self.mode.strong or self._beats is None:
            return []
        now = self._clock()
        if self._behind is None or now - self._behind[0] >= self.mode.heartbeat_seconds:
            sources = self.mode.sources
            behind = links_behind(
                sources,
                self._beats.newest(sources),
                self._links.links(sources),
                Decimal(str(now)),
                self.mode.settle_seconds,
                self.mode.heartbeat_seconds,
            )
            self._behind = (now, behind)
            if self.mode.at_home:  # a stall that ended: the next one is news
                late = {b.source for b in behind if b.why != "slow"}
                for source in set(sources) - late:
                    self._reporter.clear_standing(RULE, self._link_key(source))
        return self._behind[1]

    def held(self, *, alert: bool = True) -> str | None:
        """Why a settled finding must wait, or None when every link is live and inside the
        window. With ``alert`` (the home Region), a stalled or unheard link is alerted, once
        per stall: its finding's identity is the link, and stands until the link is live."""
        behind = self.behind()
        if not behind:
            return None
        self._book().held += 1
        for link in behind:
            if alert and link.why != "slow" and link.source not in self._alerted:
                self._alerted.add(link.source)
                self._reporter.alert_unrepaired(self._stalled(link))
        return "; ".join(b.describe() for b in behind)

    def _link_key(self, source: str) -> dict[str, str]:
        return {"source": source, "region": self.mode.region}

    def _stalled(self, link: Behind) -> Finding:
        """The link's finding: ``stored`` when the newest heartbeat the replica holds beat."""
        beat = None if link.beat_at is None else epoch_iso(float(link.beat_at))
        finding = Finding(
            kind="replication_stalled",
            rule=RULE,
            table=self._table,
            key=self._link_key(link.source),
            attribute=BEAT_AT,
            stored=beat,
            actual=None,
            detail=(
                f"{link.describe()}; settled findings wait (no repair, no alert) until it is "
                f"live again (window {self.mode.settle_seconds} s + two heartbeats of "
                f"{self.mode.heartbeat_seconds} s)"
            ),
            region=self.mode.region,
        )
        return replace(finding, repair=Repair("skipped", HELD))


def _beat(record: Mapping[str, Any]) -> tuple[str, Decimal, Decimal | None] | None:
    try:
        new = heartbeat_image(record)
        beat = None if new is None else heartbeat(deserialize(new))
        if beat is None:
            return None
        arrived = record["dynamodb"].get("ApproximateCreationDateTime")
        at = Decimal(str(arrived)) if isinstance(arrived, (int, float, Decimal)) else None
        return beat[0], beat[1], at
    except Exception:  # a forged or damaged record: not a heartbeat
        return None
