"""The replicator: reads each Region's streams, holds what that Region wrote on a link to every
other Region, and applies it there by last writer wins on the hidden stamp.

- Only a Region's own writes leave it (the origin in the hidden stamp): a replicated write is
  not sent on. Deletions travel from the tombstone table's stream.
- A link holds, per item, the newest change not yet sent (several changes replicate as one);
  each change is due after the link's lag, so items overtake each other, an item never
  overtakes itself.
- An apply is one transaction in the destination: the item written (or deleted) only if its
  stamp is newer than both the item's and its tombstone's. A version that loses changes
  nothing there, so it leaves no record (``Delivery.applied`` False, counted per link).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from tally.local.replication.clocks import KeyLocks, RegionClock
from tally.local.replication.streams import StreamTail, raw_image
from tally.local.replication.wire import (
    HIDDEN_ORIGIN,
    HIDDEN_STAMP,
    TOMBSTONES_SUFFIX,
    WireKey,
    WireStamp,
    key_attributes,
    stamp_of,
    tombstones_of,
    wire_key,
)

ItemKey = tuple[str, WireKey]  # (table, key)


@dataclass(frozen=True)
class Change:
    """One version of an item a Region wrote: ``image`` None is a deletion."""

    table: str
    key: WireKey
    image: Mapping[str, Any] | None
    stamp: WireStamp

    @property
    def item_key(self) -> ItemKey:
        return (self.table, self.key)


@dataclass(frozen=True)
class Delivery:
    source: str
    destination: str
    change: Change
    applied: bool


@dataclass(frozen=True)
class Lag:
    """How long a link takes: fixed, or drawn per change (log-normal from a median and a
    99th percentile, the shape AWS's ReplicationLatency graphs show; inferred)."""

    median_ms: float
    p99_ms: float | None = None

    def draw(self, rng: random.Random) -> float:
        if self.p99_ms is None or self.p99_ms <= self.median_ms:
            return self.median_ms / 1000
        sigma = math.log(self.p99_ms / self.median_ms) / 2.326
        return rng.lognormvariate(math.log(self.median_ms), sigma) / 1000


@dataclass
class LinkQueue:
    """What ``source`` wrote that ``destination`` has not been sent: per item the newest, with
    the time it is due."""

    source: str
    destination: str
    pending: dict[ItemKey, tuple[Change, float]] = field(default_factory=dict)
    applied: int = 0
    lost: int = 0
    sending: int = 0  # taken off ``pending``, not applied yet
    last: Change | None = None  # the change taken off last (held again if it failed)

    def hold(self, change: Change, due: float) -> None:
        held = self.pending.get(change.item_key)
        if held is None:
            self.pending[change.item_key] = (change, due)
        elif change.stamp > held[0].stamp:
            self.pending[change.item_key] = (change, held[1])  # merged: keeps its place

    def due(self, now: float) -> list[ItemKey]:
        ready = [(due, key) for key, (_, due) in self.pending.items() if due <= now]
        return [key for _, key in sorted(ready, key=lambda pair: pair[0])]


_NEWER = "attribute_not_exists(#ts) OR #ts < :ts OR (#ts = :ts AND #o < :o)"
_NAMES = {"#ts": HIDDEN_STAMP, "#o": HIDDEN_ORIGIN}


class Replicator:
    """Regions' tables joined by a link each way between every two Regions."""

    def __init__(
        self,
        backends: Mapping[str, Any],
        streams: Mapping[str, Any],
        clocks: Mapping[str, RegionClock],
        locks: KeyLocks,
        lag: Lag | None,
        seed: int = 0,
        link_lags: Mapping[tuple[str, str], Lag] | None = None,
        now: Callable[[], float] = time.monotonic,
    ):
        self.regions = list(backends)
        self._backends = backends
        self._streams = streams
        self._clocks = clocks
        self._locks = locks
        self.lag = lag
        self.link_lags = dict(link_lags or {})
        self._rng = random.Random(seed)
        self._now = now
        self.links = {(s, d): LinkQueue(s, d) for s in self.regions for d in self.regions if s != d}
        self.offline: set[str] = set()
        self._tails: dict[tuple[str, str], StreamTail] = {}  # (region, stream table) -> tail
        self._mutex = threading.RLock()
        self._reading = threading.Lock()  # one reader per stream position

    # --- collecting what each Region wrote ----------------------------------------------------

    def reads(self, region: str, table: str) -> bool:
        """Whether ``table``'s streams in ``region`` are read already."""
        return (region, table) in self._tails

    def adopt(self, region: str, table: str) -> bool:
        """Start reading ``table`` (and its tombstones) in ``region`` once both exist with a
        stream; True once it is read."""
        if self.reads(region, table):
            return True
        arns = []
        for name in (table, tombstones_of(table)):
            try:
                described = self._backends[region].describe_table(TableName=name)["Table"]
            except ClientError:
                return False
            if "LatestStreamArn" not in described:
                return False
            arns.append((name, described["LatestStreamArn"]))
        for name, arn in arns:
            self._tails[(region, name)] = StreamTail(self._streams[region], arn)
        return True

    def collect(self, region: str | None = None) -> int:
        """Read every adopted stream (of one Region, or all) and hold each own write on the
        links out of its Region; returns how many changes were held."""
        held = 0
        with self._reading:
            held = self._collect(region)
        return held

    def _collect(self, region: str | None) -> int:
        held = 0
        for (source, name), tail in list(self._tails.items()):
            if region is not None and source != region:
                continue
            for record in tail.read():
                change = self._change(source, name, record)
                if change is None:
                    continue
                with self._mutex:
                    for (s, d), link in self.links.items():
                        if s == source:
                            link.hold(change, self._now() + self._lag(s, d))
                held += 1
        return held

    def _lag(self, source: str, destination: str) -> float:
        lag = self.link_lags.get((source, destination), self.lag)
        return 0.0 if lag is None else lag.draw(self._rng)

    @staticmethod
    def _change(source: str, name: str, record: Mapping[str, Any]) -> Change | None:
        image = record.get("dynamodb", {}).get("NewImage")
        if image is None:
            return None  # a deletion of the table travels from its tombstone
        stamp = stamp_of(image)
        if stamp is None or stamp.origin != source:
            return None  # written by the replicator: not sent on
        key = wire_key(raw_image(record["dynamodb"]["Keys"]))
        if name.endswith(TOMBSTONES_SUFFIX):
            return Change(name.removesuffix(TOMBSTONES_SUFFIX), key, None, stamp)
        return Change(name, key, raw_image(image), stamp)

    # --- delivering ---------------------------------------------------------------------------

    def deliverable(self) -> list[tuple[str, str, ItemKey]]:
        with self._mutex:
            return [
                (s, d, key)
                for (s, d), link in self.links.items()
                if not {s, d} & self.offline
                for key in link.pending
            ]

    def deliver_due(self) -> list[Delivery]:
        """Deliver every change whose lag has passed, on every link between online Regions."""
        done: list[Delivery] = []
        for (s, d), link in self.links.items():
            if {s, d} & self.offline:
                continue
            with self._mutex:
                keys = link.due(self._now())
            done.extend(self.deliver(s, d, key) for key in keys)
        return done

    def deliver(self, source: str, destination: str, key: ItemKey) -> Delivery:
        """Send the newest change of ``key`` held from ``source`` to ``destination`` and apply
        it there if it is newer than what that Region holds."""
        link = self.links[(source, destination)]
        with self._mutex:
            change, _ = link.pending.pop(key)
            link.sending += 1
            link.last = change
        try:
            applied = self._apply(destination, change)
        finally:
            with self._mutex:
                link.sending -= 1
        with self._mutex:
            if applied:
                link.applied += 1
            else:
                link.lost += 1
        return Delivery(source, destination, change, applied)

    def _apply(self, region: str, change: Change) -> bool:
        values = {":ts": {"N": str(change.stamp.at)}, ":o": {"S": change.stamp.origin}}
        newer = {
            "ConditionExpression": _NEWER,
            "ExpressionAttributeNames": _NAMES,
            "ExpressionAttributeValues": values,
        }
        key = key_attributes(change.key)
        tombstones = tombstones_of(change.table)
        if change.image is None:
            actions = [
                {"Delete": {"TableName": change.table, "Key": key, **newer}},
                {
                    "Put": {
                        "TableName": tombstones,
                        "Item": {**key, **change.stamp.attributes()},
                        **newer,
                    }
                },
            ]
        else:
            actions = [
                {"ConditionCheck": {"TableName": tombstones, "Key": key, **newer}},
                {"Put": {"TableName": change.table, "Item": dict(change.image), **newer}},
            ]
        with self._locks.hold(region, [change.item_key]):
            self._clocks[region].observe(change.stamp.at)
            for _ in range(100):
                try:
                    self._backends[region].transact_write_items(TransactItems=actions)
                    return True
                except ClientError as exc:
                    reasons = exc.response.get("CancellationReasons", [])
                    codes = {r.get("Code") for r in reasons}
                    if "ConditionalCheckFailed" in codes:
                        return False
                    if not codes & {"TransactionConflict"} and exc.response["Error"][
                        "Code"
                    ] not in ("TransactionConflictException", "TransactionInProgressException"):
                        raise
                    time.sleep(0.01)
            raise RuntimeError(f"{region}: could not apply {change} (conflicts)")

    # --- Regions down and back ----------------------------------------------------------------

    def take_offline(self, region: str) -> None:
        with self._mutex:
            self.offline.add(region)

    def bring_back(self, region: str) -> None:
        """Back online: what its links held meanwhile is due now (replayed)."""
        with self._mutex:
            self.offline.discard(region)

    def due(self, source: str, destination: str) -> list[ItemKey]:
        """The items whose change on the link is due now, oldest due first."""
        with self._mutex:
            return self.links[(source, destination)].due(self._now())

    def hold_again(self, source: str, destination: str, key: ItemKey) -> None:
        """A delivery that failed to reach its destination: its change waits again, due now
        (a newer change of the item held meanwhile stays the one sent)."""
        link = self.links[(source, destination)]
        with self._mutex:
            if link.last is not None and link.last.item_key == key:
                link.hold(link.last, self._now())

    def busy(self) -> bool:
        """Whether a link between online Regions holds a change or is applying one."""
        with self._mutex:
            return any(
                link.pending or link.sending
                for (s, d), link in self.links.items()
                if not {s, d} & self.offline
            )

    def status(self) -> dict[str, Any]:
        with self._mutex:
            return {
                "offline": sorted(self.offline),
                "links": {
                    f"{s} -> {d}": {
                        "pending": len(link.pending),
                        "applied": link.applied,
                        "lost": link.lost,
                    }
                    for (s, d), link in self.links.items()
                },
            }
