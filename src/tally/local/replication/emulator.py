"""A Global Table on a laptop: a front per Region, one DynamoDB Local behind each (one for
all of them in the strongly consistent profile), and the replicator between them.

With a ``lag`` the replicator runs by itself (a thread reads the streams, a thread per link
delivers what is due). Without one it is **deterministic**: nothing moves until a test says
so: ``collect()`` reads what each Region wrote, ``deliver(source, destination, key)`` sends
one item's change over one link, ``settle()`` delivers everything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from tally.local.replication.clocks import KeyLocks, RegionClock
from tally.local.replication.proxy import ConflictWindow, RegionFront, RegionServer
from tally.local.replication.replicator import Delivery, ItemKey, Lag, Replicator
from tally.local.replication.wire import tombstones_of, wire_key

Consistency = Literal["eventual", "strong"]

_CLIENT = Config(retries={"mode": "standard", "total_max_attempts": 5}, max_pool_connections=32)


def backend_client(
    service: Literal["dynamodb", "dynamodbstreams"], endpoint: str, region: str
) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=_CLIENT,
    )


class EmulatorError(ValueError):
    """A configuration or a step the emulator cannot take."""


@dataclass
class Settings:
    """What `tally local up --regions` (or a test) asks of the emulator."""

    regions: Mapping[str, str]  # Region -> its DynamoDB Local (one shared for "strong")
    tables: Sequence[str]  # the replicated tables
    consistency: Consistency = "eventual"
    lag: Lag | None = None  # None: deterministic
    link_lags: Mapping[tuple[str, str], Lag] = field(default_factory=dict)  # per link, else lag
    skew_ms: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0
    conflict_window_ms: float = 50.0
    ports: Mapping[str, int] = field(default_factory=dict)


class Emulator:
    def __init__(self, settings: Settings):
        regions = list(settings.regions)
        if len(set(regions)) != len(regions) or len(regions) < 2:
            raise EmulatorError(f"two or more distinct Regions, not {regions}")
        unknown = (set(settings.skew_ms) | {r for link in settings.link_lags for r in link}) - set(
            regions
        )
        if unknown:
            raise EmulatorError(f"skew or lag for Regions not emulated: {sorted(unknown)}")
        if settings.link_lags and settings.lag is None:
            raise EmulatorError("a lag per link needs a lag for the others (deterministic mode)")
        if settings.consistency == "strong":
            if len(regions) != 3:
                raise EmulatorError("a strongly consistent (MRSC) table has exactly three Regions")
            if len(set(settings.regions.values())) != 1:
                raise EmulatorError("the strongly consistent profile runs on one database")
        self.settings = settings
        self.regions = regions
        self.locks = KeyLocks()
        self.clocks = {r: RegionClock(r, int(settings.skew_ms.get(r, 0) * 1000)) for r in regions}
        self.backends = {r: backend_client("dynamodb", u, r) for r, u in settings.regions.items()}
        streams = {r: backend_client("dynamodbstreams", u, r) for r, u in settings.regions.items()}
        self.replicator = Replicator(
            self.backends,
            streams,
            self.clocks,
            self.locks,
            settings.lag,
            settings.seed,
            settings.link_lags,
        )
        conflicts = (
            ConflictWindow(settings.conflict_window_ms / 1000)
            if settings.consistency == "strong"
            else None
        )
        self.servers = {
            r: RegionServer(
                RegionFront(
                    r,
                    settings.regions[r],
                    self.backends[r],
                    settings.tables,
                    self.clocks[r],
                    self.locks,
                    conflicts,
                    self.control,
                    self.adopt,
                    regions,
                ),
                port=settings.ports.get(r, 0),
            )
            for r in regions
        }
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._trouble: dict[str, str] = {}  # what keeps a thread from its work, by thread

    @property
    def eventual(self) -> bool:
        return self.settings.consistency == "eventual"

    @property
    def offline(self) -> set[str]:
        return set(self.replicator.offline)

    def endpoint(self, region: str) -> str:
        return self._server(region).endpoint

    def endpoints(self) -> dict[str, str]:
        return {r: s.endpoint for r, s in self.servers.items()}

    # --- running ------------------------------------------------------------------------------

    def start(self) -> Emulator:
        for server in self.servers.values():
            server.start()
        if self.eventual and self.settings.lag is not None:
            self._run("replication-collect", self._collecting)
            for source, destination in self.replicator.links:
                self._run(f"link {source}->{destination}", self._delivering, source, destination)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for server in self.servers.values():
            server.stop()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _run(self, name: str, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _collecting(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.collect()
                self._trouble.pop("collect", None)
            except Exception as exc:  # a thread that dies stops replication for good
                # A table being made or deleted, a database not answering: read again next
                # time; the status says why meanwhile.
                self._trouble["collect"] = f"{type(exc).__name__}: {exc}"

    def _delivering(self, source: str, destination: str) -> None:
        name = f"{source} -> {destination}"
        while not self._stop.wait(0.005):
            if {source, destination} & self.replicator.offline:
                continue
            for key in self.replicator.due(source, destination):
                try:
                    self.replicator.deliver(source, destination, key)
                    self._trouble.pop(name, None)
                except Exception as exc:  # a thread that dies stops replication for good
                    if _table_gone(exc):
                        continue  # the table is gone in the destination: nothing to apply
                    # The destination does not answer, or conflicts outlast the retries: the
                    # change waits on the link, due again now.
                    self.replicator.hold_again(source, destination, key)
                    self._trouble[name] = f"{type(exc).__name__}: {exc}"
                    break

    # --- deterministic steps ------------------------------------------------------------------

    def adopt(self) -> None:
        """Make each replicated table's tombstone table and start reading its streams, in
        every Region where the table exists."""
        if not self.eventual:
            return
        for region in self.regions:
            for table in self.settings.tables:
                if self.replicator.reads(region, table) or not self._exists(region, table):
                    continue  # read already (collect runs every 20 ms: no DescribeTable then)
                self._ensure_tombstones(region, table)
                self.replicator.adopt(region, table)

    def collect(self) -> int:
        """Read what each Region wrote since the last read onto the links out of it."""
        if not self.eventual:
            return 0
        self.adopt()
        return self.replicator.collect()

    def pending(self, source: str, destination: str) -> list[ItemKey]:
        link = self.replicator.links.get((source, destination))
        if link is None:
            raise EmulatorError(f"no link {source} -> {destination}")
        return list(link.pending)

    def deliver(
        self, source: str, destination: str, table: str, key: Mapping[str, Any]
    ) -> Delivery:
        """Send the newest change of one item from ``source`` to ``destination`` (what each
        Region wrote is collected first); raises if that link holds none or a Region is
        offline."""
        item_key = (table, wire_key(key))
        self.collect()
        if {source, destination} & self.replicator.offline:
            raise EmulatorError(f"{source} -> {destination}: a Region is offline")
        if item_key not in self.pending(source, destination):
            raise EmulatorError(f"{source} -> {destination} holds no change of {dict(key)}")
        return self.replicator.deliver(source, destination, item_key)

    def settle(self, timeout: float = 60.0) -> list[Delivery]:
        """Until every link between online Regions has delivered everything its Region wrote:
        by hand in deterministic mode; by waiting for the links otherwise."""
        deadline = time.monotonic() + timeout
        if self.settings.lag is None:
            done: list[Delivery] = []
            while True:
                self.collect()
                steps = self.replicator.deliverable()
                if not steps:
                    return done
                done.extend(self.replicator.deliver(s, d, k) for s, d, k in steps)
        while time.monotonic() < deadline:
            if self.collect() == 0 and not self.replicator.busy():
                return []
            time.sleep(0.02)
        raise EmulatorError(f"replication did not settle within {timeout:g} s")

    def take_offline(self, region: str) -> None:
        self._server(region)
        self.replicator.take_offline(region)

    def bring_back(self, region: str) -> None:
        self._server(region)
        self.replicator.bring_back(region)

    def status(self) -> dict[str, Any]:
        return {
            "consistency": self.settings.consistency,
            "regions": self.endpoints(),
            "tables": list(self.settings.tables),
            **self.replicator.status(),
            "trouble": dict(self._trouble),
            "threads_alive": all(t.is_alive() for t in self._threads),
        }

    def control(self, method: str, action: str, given: dict[str, Any]) -> Any:
        """The fronts' ``/__emulator/<action>``: status, offline, online, settle."""
        if action == "status":
            return self.status()
        if method != "POST":
            raise LookupError(f"POST /__emulator/{action}")
        if action == "offline":
            self.take_offline(str(given.get("region")))
        elif action == "online":
            self.bring_back(str(given.get("region")))
        elif action == "settle":
            self.settle(float(given.get("timeout", 60)))
        else:
            raise LookupError(f"no emulator action {action!r}: status, offline, online, settle")
        return self.status()

    def _server(self, region: str) -> RegionServer:
        try:
            return self.servers[region]
        except KeyError:
            raise LookupError(
                f"no Region {region!r}; the Regions: {', '.join(self.servers)}"
            ) from None

    def _exists(self, region: str, table: str) -> bool:
        try:
            self.backends[region].describe_table(TableName=table)
            return True
        except ClientError:
            return False

    def _ensure_tombstones(self, region: str, table: str) -> None:
        backend = self.backends[region]
        described = backend.describe_table(TableName=table)["Table"]
        if "LatestStreamArn" not in described:
            # Global Tables need a stream of new and old images (AWS turns it on).
            backend.update_table(
                TableName=table,
                StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
            )
        name = tombstones_of(table)
        if self._exists(region, name):
            return
        keys = described["KeySchema"]
        used = {k["AttributeName"] for k in keys}
        try:
            backend.create_table(
                TableName=name,
                KeySchema=keys,
                AttributeDefinitions=[
                    a for a in described["AttributeDefinitions"] if a["AttributeName"] in used
                ],
                BillingMode="PAY_PER_REQUEST",
                StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ResourceInUseException":
                raise


def _table_gone(exc: Exception) -> bool:
    return (
        isinstance(exc, ClientError)
        and exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException"
    )
