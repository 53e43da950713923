"""Global Tables' replication between Regions (MREC), as values: last writer wins per item on
a hidden timestamp, what each directed link holds, and what a delivery does where it lands.

- A write in a Region always applies there (DynamoDB checked its conditions against that
  Region's replica alone) and gets a ``Stamp``: the Region's clock (skew included) and its
  name. The stamp is hidden: it is never part of the item a reader or the reconciler sees.
- Each link (source -> destination) holds, per item, the newest version the source wrote that
  the destination has not been sent: several changes to an item in a short time replicate as
  one (merged), order is kept per item only (any item's may go first), and a transaction's
  items replicate one by one.
- A delivery applies at the destination only if its stamp is newer than the version held there
  (deleted items keep theirs, as tombstones); a version that loses changes nothing and leaves
  no trace there (inferred: AWS documents no record for it).
- A Region offline sends and receives nothing; what its links hold waits, and is replayed,
  then resolved by the same rule, when it is back.

Which of these AWS documents and which are inferred: docs/global-tables.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# An item's primary key, hashable: its attribute names and values, sorted by name.
Key = tuple[tuple[str, Any], ...]


def key_of(attributes: Mapping[str, Any]) -> Key:
    return tuple(sorted(attributes.items()))


@dataclass(frozen=True, order=True)
class Stamp:
    """The hidden timestamp: the writing Region's clock in microseconds, then, on a tie, the
    Region's name (inferred: AWS documents no tie-break; any fixed order converges)."""

    at: int
    region: str


@dataclass(frozen=True)
class Version:
    """One item as a Region wrote it: ``item`` None is a deletion (kept as a tombstone)."""

    key: Key
    item: Mapping[str, Any] | None
    stamp: Stamp

    @property
    def deleted(self) -> bool:
        return self.item is None


def wins(incoming: Version, held: Version | None) -> bool:
    """Last writer wins: the incoming version applies only over an older one, or none."""
    return held is None or incoming.stamp > held.stamp


@dataclass
class Replica:
    """One Region's copy of the table, with the hidden stamp of each item (and tombstone)."""

    region: str
    versions: dict[Key, Version] = field(default_factory=dict)

    def items(self) -> dict[Key, Mapping[str, Any]]:
        """What a reader in this Region sees: the items, no stamps, no tombstones."""
        return {k: v.item for k, v in self.versions.items() if v.item is not None}


@dataclass
class Link:
    """What ``source`` wrote that ``destination`` was not sent yet: per item, the newest."""

    source: str
    destination: str
    pending: dict[Key, Version] = field(default_factory=dict)

    def hold(self, version: Version) -> None:
        """A change to send; a newer one of the same item replaces it (merged)."""
        held = self.pending.get(version.key)
        if wins(version, held):
            self.pending.pop(version.key, None)  # its place in line is the newest change's
            self.pending[version.key] = version


@dataclass(frozen=True)
class Delivery:
    """One version sent over a link, and whether it applied where it landed."""

    source: str
    destination: str
    version: Version
    applied: bool


class ReplicationError(ValueError):
    """A step the replication cannot take (an unknown Region, nothing held, a Region offline)."""


class Replication:
    """Regions, each a replica, joined by a link each way between every two of them."""

    def __init__(self, regions: Sequence[str], skew: Mapping[str, int] | None = None):
        if len(set(regions)) != len(regions) or len(regions) < 2:
            raise ReplicationError(f"two or more distinct Regions, not {list(regions)}")
        self.replicas = {r: Replica(r) for r in regions}
        self.links = {(s, d): Link(s, d) for s in regions for d in regions if s != d}
        self.skew = {r: 0 for r in regions} | dict(skew or {})
        self.offline: set[str] = set()

    # --- writes in one Region --------------------------------------------------------

    def write(
        self, region: str, key: Mapping[str, Any], item: Mapping[str, Any] | None, at: int
    ) -> Version:
        """A write (``item`` None: a delete) made in ``region`` when the true time is ``at``
        microseconds: applied there, held on every link out of it."""
        [version] = self.transact(region, [(key, item)], at)
        return version

    def transact(
        self,
        region: str,
        writes: Iterable[tuple[Mapping[str, Any], Mapping[str, Any] | None]],
        at: int,
    ) -> list[Version]:
        """A transaction in ``region``: atomic there, its items held one by one on each link
        (inferred: one stamp for all of them, the transaction's time, and later than every
        version it replaces there, even one stamped by a clock running ahead; else a Region
        would keep its own write while the others keep the one it replaced)."""
        replica = self._replica(region)
        written = [(key_of(k), None if i is None else dict(i)) for k, i in writes]
        held = [replica.versions[k].stamp.at for k, _ in written if k in replica.versions]
        stamp = Stamp(max([at + self.skew[region], *(h + 1 for h in held)]), region)
        versions = [Version(key, item, stamp) for key, item in written]
        for version in versions:
            replica.versions[version.key] = version  # a local write always applies locally
            for (source, _), link in self.links.items():
                if source == region:
                    link.hold(version)
        return versions

    # --- what the links do -------------------------------------------------------------

    def deliverable(self) -> list[tuple[str, str, Key]]:
        """Every (source, destination, key) a delivery may take now: both Regions online."""
        return [
            (s, d, key)
            for (s, d), link in self.links.items()
            if s not in self.offline and d not in self.offline
            for key in link.pending
        ]

    def deliver(self, source: str, destination: str, key: Key) -> Delivery:
        """Send the newest change of ``key`` held from ``source`` to ``destination``; it applies
        there only if it is newer than what is held (else it changes nothing)."""
        link = self.links.get((source, destination))
        if link is None:
            raise ReplicationError(f"no link {source} -> {destination}")
        if {source, destination} & self.offline:
            raise ReplicationError(f"{source} -> {destination}: a Region is offline")
        if key not in link.pending:
            raise ReplicationError(f"{source} -> {destination} holds no change of {dict(key)}")
        version = link.pending.pop(key)
        replica = self.replicas[destination]
        applied = wins(version, replica.versions.get(key))
        if applied:
            replica.versions[key] = version
        return Delivery(source, destination, version, applied)

    def settle(self) -> list[Delivery]:
        """Deliver everything deliverable, oldest held first on each link."""
        done = []
        while steps := self.deliverable():
            done.append(self.deliver(*steps[0]))
        return done

    # --- Regions down and back -------------------------------------------------------------

    def take_offline(self, region: str) -> None:
        self._replica(region)
        self.offline.add(region)

    def bring_back(self, region: str) -> None:
        """Back online: what its links hold (its own writes meanwhile, and the others') is
        delivered from now on, in turn resolved by last writer wins."""
        self._replica(region)
        self.offline.discard(region)

    def _replica(self, region: str) -> Replica:
        try:
            return self.replicas[region]
        except KeyError:
            raise ReplicationError(
                f"no Region {region!r}; the Regions: {', '.join(self.replicas)}"
            ) from None
