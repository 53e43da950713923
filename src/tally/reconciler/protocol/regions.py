"""Losses on a multi-Region table, read from one Region's own stream (docs/global-tables.md).

Last writer wins per item. The evidence a write was lost sits only in the stream of the Region
that made it: the winner's version replaces its own as a ``MODIFY`` whose OldImage still holds
what was lost. With the writers' stamps (``tally.core.regions``) a Region reads two losses
of its own there, and only its own (so each is reported by one Region, however many there
are):

- **a child overwritten**: the OldImage is a child this Region created (its id says so) and
  the NewImage is another child under the same key (another id): a number handed out twice,
  or a like made in two Regions; the lost child's payload is the OldImage. The other child
  may be this Region's own: a writer whose put has no condition (seed 003's) hands a number
  out again once last writer wins sent its counter back, and replaces its own member;
- **increments lost**: the OldImage of a parent holds more of this Region's writes than the
  NewImage that replaced it.

A parent that keeps losing increments, written from several Regions, is **contended**
(``contended``): escalated instead of repaired again and again.

Either loss is provisional while replication runs: with three or more Regions a newer version
that still holds the write can arrive later. ``still_lost`` judges a loss again against the
item as the Region holds it once replication has settled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from tally.core.regions import CHILD_ID, ORIGIN, created_in, is_regional, writes, writing_regions
from tally.rules import AnyRule, RuleSet, TallyRule

LossKind = Literal["child_overwritten", "increments_lost"]


@dataclass(frozen=True)
class Loss:
    """A write of ``region`` that a version from ``winner`` replaced."""

    kind: LossKind
    region: str
    key: dict[str, Any]
    winner: str | None
    lost_child: dict[str, Any] | None = None  # the child's payload (child_overwritten)
    child_id: str | None = None
    writes: Decimal = Decimal(0)  # how many of the Region's writes (increments_lost)


def _number(image: Mapping[str, Any], name: str) -> Decimal:
    value = image.get(name)
    return value if isinstance(value, Decimal) else Decimal(0)


def own_loss(
    event: str,
    key: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    region: str,
) -> Loss | None:
    """The loss of one of ``region``'s writes this record of its stream shows, if any (images
    as plain values: ``TypeDeserializer``'s)."""
    if event != "MODIFY" or old is None or new is None:
        return None  # a deletion is not an overwrite; an insert replaced nothing
    winner = new.get(ORIGIN) if isinstance(new.get(ORIGIN), str) else None
    mine, theirs = old.get(CHILD_ID), new.get(CHILD_ID)
    # Our child replaced by another Region's version, or, here, by a second child of ours (a
    # put without a condition: seed 003's allocator after last writer wins sent its count
    # back). A local write that carries no id is not a creation this can prove.
    replaced = winner != region or created_in(theirs) is not None
    if created_in(mine) == region and theirs != mine and replaced:
        payload = {n: v for n, v in old.items() if not is_regional(n)}
        return Loss("child_overwritten", region, dict(key), winner, payload, str(mine))
    if winner == region:
        return None  # this Region's own write: a local write loses no increment locally
    lost_writes = _number(old, writes(region)) - _number(new, writes(region))
    if lost_writes > 0:
        return Loss("increments_lost", region, dict(key), winner, writes=lost_writes)
    return None


def still_lost(loss: Loss, now: Mapping[str, Any] | None) -> bool:
    """Whether a loss stands against the item as its Region holds it now, replication settled:
    a child is lost unless the item is that child again; increments are judged by the parent's
    recount in its home Region, so their loss stands as read."""
    if loss.kind == "child_overwritten":
        return now is None or now.get(CHILD_ID) != loss.child_id
    return True


# A parent repaired this many times in the window, its counters written by the writers of a
# Global Table, is contended: its increments keep losing to last writer wins.
CONTENDED_AFTER = 3
CONTENDED_WINDOW_SECONDS = 24 * 3600


def contended(parent: Mapping[str, Any] | None, repairs: int, after: int) -> tuple[str, ...]:
    """The Regions stamped on a parent repaired ``repairs`` times in the window, when that
    makes it contended (``after`` repairs or more, and its counters written by the stamping
    writers); else ``()``.

    On a Global Table a counter bumped in the child's own transaction drifts, once
    replication settled, only when last writer wins drops an increment (or a writer outside
    ours changes it). Repaired, it is right until the next race: the finding asks a person
    to route its writes to one Region or split its counter per Region. The stamps name only
    the Regions whose writes the surviving version holds: a Region that always loses is
    missing from them, so one stamped Region is enough. A parent no stamping writer wrote
    is repaired, as on any table."""
    regions = writing_regions(parent or {})
    return regions if regions and repairs >= after else ()


@dataclass(frozen=True)
class GlobalMode:
    """The reconciler on one Region of a Global Table: which Region it is, the table's
    Regions, the home Region (the one that judges every parent: one Region for all, so a
    child and every parent it counts for are judged in one place), the settle window, and
    whether the table is strongly consistent (MRSC: DynamoDB refuses any transaction that
    touches it, so a repair is one conditional write, its audit items committed apart)."""

    region: str
    regions: tuple[str, ...]
    home: str
    settle_seconds: int
    contended_after: int = CONTENDED_AFTER
    strong: bool = False
    heartbeat_seconds: int = 60

    def __post_init__(self) -> None:
        if self.region not in self.regions or self.home not in self.regions:
            raise ValueError(f"{self.region} and {self.home} must be of {list(self.regions)}")

    @property
    def at_home(self) -> bool:
        """Whether this Region judges the parents (recounts, gaps, the full audit)."""
        return self.region == self.home

    @property
    def sources(self) -> tuple[str, ...]:
        """The Regions whose writes replicate into this one."""
        return tuple(r for r in self.regions if r != self.region)


@dataclass(frozen=True)
class Link:
    """The newest heartbeat this Region's stream brought from ``source``: when it beat there
    (the source's clock) and when its record arrived here."""

    source: str
    beat_at: Decimal
    arrived_at: Decimal

    @property
    def lag(self) -> Decimal:
        """Replication's lag on this link, measured on that beat (0 if the clocks disagree
        the other way)."""
        return max(Decimal(0), self.arrived_at - self.beat_at)


@dataclass(frozen=True)
class Behind:
    """A link replication cannot be trusted to have settled on, and why."""

    source: str
    why: Literal["unheard", "stalled", "slow"]
    beat_at: Decimal | None = None  # the newest heartbeat this Region holds from it
    age: Decimal | None = None  # how old that is (stalled)
    lag: Decimal | None = None  # the lag measured on the newest heard (slow)

    def describe(self) -> str:
        if self.why == "unheard":
            return (
                f"no heartbeat from {self.source} in this Region's replica (its stack "
                "deployed and beating?)"
            )
        if self.why == "stalled":
            return (
                f"replication from {self.source} stalled: its newest heartbeat here is "
                f"{self.age:.0f} s old"
            )
        return f"replication from {self.source} lags {self.lag:.1f} s, over the window"


def links_behind(
    sources: tuple[str, ...],
    beats: Mapping[str, Decimal],
    heard: Mapping[str, Link],
    now: Decimal,
    settle_seconds: int,
    heartbeat_seconds: int,
) -> list[Behind]:
    """The links from ``sources`` that an imbalance cannot wait out (docs/global-tables.md,
    "Heartbeats"), from the heartbeats this Region's replica holds (``beats``: when each
    source last beat, as far as replication brought it) and the lags its stream measured
    (``heard``): none in the replica (**unheard**); its newest heartbeat here older than the
    settle window and two beat intervals (**stalled**: the beats after it are held somewhere,
    and so may be writes; one beat missed, a scheduled invocation failed, is not a stall); or
    the lag last measured on it longer than the window (**slow**).
    An imbalance is evidence only once every link is live and inside the window."""
    behind: list[Behind] = []
    for source in sources:
        beat_at = beats.get(source)
        if beat_at is None:
            behind.append(Behind(source, "unheard"))
            continue
        age = now - beat_at
        link = heard.get(source)
        if age > settle_seconds + 2 * heartbeat_seconds:
            behind.append(Behind(source, "stalled", beat_at, age))
        elif link is not None and link.lag > settle_seconds:
            behind.append(Behind(source, "slow", beat_at, lag=link.lag))
    return behind


def settled_rules(rules: RuleSet, settle_seconds: int) -> RuleSet:
    """The rules as a Global Table's home Region judges them.

    Every count and sum whose children may arrive from another Region before or after its
    counter is judged only once replication had ``settle_seconds``, as a counter a stream
    aggregator keeps: two recounts that far apart must see the same counter and truth. Its
    repair mode stays the rule's: an ``auto`` rule is then repaired, fenced on what the second
    recount read (``checks.looks.verify_aggregated``). A sequence's gaps are judged after at
    least that grace and alerted, never repaired: a void marker or a raised counter written in
    one Region would race a member still on its way from another, and last writer wins would
    drop one of them. A TTL removal is alerted, not decremented. A rule already judged after a
    lag keeps its own (alert-only, as ever); one whose writers stamp its parents
    (``through.stamp``) is judged by its stamps, and alerted.

    On a strongly consistent table (MRSC) nothing lags, but the same rules hold for another
    reason: with no transaction a writer makes its child and its counter's bump as two
    writes, and a recount between them sees a writer in flight; ``settle_seconds`` is then
    the longest a writer takes between the two.
    """
    settled: list[AnyRule] = []
    for rule in rules:
        if isinstance(rule, TallyRule):
            changes: dict[str, Any] = {"on_ttl_expiry": "alert"}
            if rule.through is not None and rule.through.stamp is not None:
                changes["repair"] = "alert"
            elif rule.lag_seconds is None:
                changes["lag_seconds"] = settle_seconds
            settled.append(rule.model_copy(update=changes))
        else:
            grace = max(rule.grace_seconds, settle_seconds)
            settled.append(rule.model_copy(update={"grace_seconds": grace, "repair": "alert"}))
    return RuleSet(rules.table, settled)
