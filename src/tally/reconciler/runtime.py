"""Wiring for the Lambda handlers: clients once per cold start, a Reconciler per invocation."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric
from botocore.config import Config

from tally.core.aws import RETRY_CONFIG, client
from tally.core.observability import logger, metrics
from tally.core.settings import settings
from tally.reconciler.checks.carry_book import CarryId
from tally.reconciler.protocol.regions import GlobalMode, settled_rules
from tally.reconciler.repair.policy import RepairPolicy
from tally.reconciler.repair.switch_parameter import SwitchParameter
from tally.reconciler.repair.switches import Switches
from tally.reconciler.report.alerts import AlertPublisher
from tally.reconciler.report.rechecks import RecheckQueue
from tally.reconciler.report.scheduling import PendingLooks
from tally.reconciler.stats import Stats
from tally.reconciler.store.parts import Store
from tally.reconciler.table.heartbeats import Heartbeats
from tally.reconciler.table.tally_table import TallyTable
from tally.reconciler.verification import Reconciler
from tally.rules import RuleSet, load_rules


@lru_cache(maxsize=1)
def rules() -> RuleSet:
    """The bundled rules file, validated at cold start; on a Global Table, settled."""
    loaded = load_rules(settings().rules_file)
    mode = global_mode()
    return loaded if mode is None else settled_rules(loaded, mode.settle_seconds)


@lru_cache(maxsize=1)
def global_mode() -> GlobalMode | None:
    """This Region's part of a Global Table (GLOBAL_REGIONS set), else None."""
    env = settings()
    regions = env.regions()
    if not regions:
        return None
    assert env.aws_region is not None  # the settings checked it is one of them
    home = env.home_region or regions[0]
    strong = env.global_consistency == "strong"
    return GlobalMode(
        env.aws_region,
        tuple(regions),
        home,
        env.settle_seconds,
        env.contended_after_repairs,
        strong,
        env.heartbeat_seconds,
    )


def heartbeats() -> Heartbeats:
    """The table's heartbeat items (a Global Table's), refused if a rule claims their key or
    a key attribute is not a string."""
    mode = global_mode()
    regions = mode.regions if mode else ()
    return Heartbeats.of(_clients()[0], settings().table_name, rules(), regions)


def at_home() -> bool:
    """Whether this function judges parents: always on a single-Region table; on a Global
    Table, in the home Region only."""
    mode = global_mode()
    return mode is None or mode.at_home


# The outbox retries a failed publish; an SDK retry of a publish whose response was lost
# would only fan out into copies of the same alert.
# Bounded calls, so the handler's deadline (it stops starting groups 20 s before the
# timeout) holds: a stalled call fails within about 3 x 18 s instead of botocore's minutes.
_BOUNDED = RETRY_CONFIG.merge(
    Config(
        connect_timeout=3,
        read_timeout=15,
        retries={"mode": "standard", "total_max_attempts": 3},
    )
)
_NO_RETRY = _BOUNDED.merge(Config(retries={"mode": "standard", "total_max_attempts": 1}))
# The switches' read is short: one that cannot be had fails safe (no repairs) in seconds,
# and the next invocation tries again.
_SWITCHES = RETRY_CONFIG.merge(
    Config(connect_timeout=2, read_timeout=3, retries={"mode": "standard", "total_max_attempts": 2})
)
# Hot parents with an open carry, known to this warm container across invocations.
_OPEN_CARRIES: set[CarryId] = set()
# Looks at aggregated counters this warm container sent that have not come due.
_PENDING_LOOKS = PendingLooks()


@lru_cache(maxsize=1)
def _clients() -> tuple[Any, Any, Any]:
    return (
        client("dynamodb", config=_BOUNDED),
        client("sns", config=_NO_RETRY),
        client("sqs", config=_BOUNDED),
    )


@lru_cache(maxsize=4)
def _switch_parameter(name: str, max_age: int) -> SwitchParameter:
    """One per warm container: its cache is what keeps the parameter read once per max_age."""
    return SwitchParameter(name, client("ssm", config=_SWITCHES), max_age)


def switches() -> Switches:
    """The repair switches now: the parameter's (REPAIR_SWITCHES_PARAMETER, kept
    REPAIR_SWITCHES_MAX_AGE_SECONDS), else the environment's; unreadable: no repairs."""
    env = settings()
    if not env.repair_switches_parameter:
        return Switches(env.repairs_enabled, env.dry_run, env.repair_budget, "environment")
    read = _switch_parameter(env.repair_switches_parameter, env.repair_switches_max_age).read()
    if read.unreadable:
        logger.warning("repair switches unreadable: no repairs", extra=read.as_json())
    return read


def reconciler(
    policy: RepairPolicy | None = None, *, alerting: bool = True, carrying: bool | None = None
) -> Reconciler:
    """A fresh Reconciler: its stats and repair budget are per invocation. By default it
    repairs as the repair switches say, alerts, and carries unless batches may run
    concurrently."""
    env = settings()
    dynamodb, sns, sqs = _clients()
    store = Store(dynamodb, env.require("audit_table_name"))
    return Reconciler(
        rules(),
        TallyTable(dynamodb, env.table_name, rules()),
        store,
        AlertPublisher(sns, env.require("alert_topic_arn"), store.outbox),
        RecheckQueue(sqs, env.require("recheck_queue_url")),
        policy or RepairPolicy.of(switches()),
        remind_seconds=env.alert_reminder_hours * 3600,
        carry_seconds=env.carry_seconds,
        open_carries=_OPEN_CARRIES,
        pending_looks=_PENDING_LOOKS,
        carrying=env.parallelization_factor == 1 if carrying is None else carrying,
        concurrency=env.verify_concurrency,
        alerting=alerting,
        regions=global_mode(),
    )


def emit_metrics(verified: Reconciler) -> None:
    """The invocation's numbers as EMF metrics (flushed by the handler's log_metrics)."""
    stats: Stats = verified.stats
    reads = verified.table.reads
    count = MetricUnit.Count
    for name, value in (
        ("RecordsSeen", stats.records),
        ("RecordsSkipped", stats.skipped),
        ("OwnWrites", stats.own_writes),
        ("MalformedRecords", stats.malformed),
        ("GroupsBalanced", stats.balanced),
        ("GroupsCarried", stats.carried),
        ("ParentsChecked", stats.checked),
        ("Recounts", reads.recounts),
        ("RecountItemsRead", reads.items),
        ("Deferred", stats.deferred),
        ("RechecksScheduled", stats.rechecks),
        ("LooksCoalesced", stats.coalesced),
        ("TtlDecrements", stats.ttl_decrements),
        ("AlertsPublished", stats.alerts),
    ):
        metrics.add_metric(name=name, unit=count, value=value)
    metrics.add_metric(name="RecountCapacity", unit=count, value=float(reads.capacity))
    # Every invocation says whether it could read the switches (an alarm watches it).
    unreadable = verified.policy.switches is not None and bool(verified.policy.switches.unreadable)
    metrics.add_metric(name="RepairSwitchesUnreadable", unit=count, value=int(unreadable))
    metrics.add_metric(
        name="CarryCapacity", unit=count, value=float(verified.store.carries.carry_units)
    )
    if stats.checked:
        share = 100 * stats.consistent / stats.checked
        metrics.add_metric(name="ConsistencyShare", unit=MetricUnit.Percent, value=share)
    for lifetime in stats.drift_lifetimes:
        metrics.add_metric(name="DriftLifetime", unit=MetricUnit.Seconds, value=lifetime)
    if verified.regions is not None:  # a Global Table's
        metrics.add_metric(name="SettledFindingsHeld", unit=count, value=stats.held)
    for source, lag in stats.replication_lags:
        with single_metric(
            name="ReplicationLag", unit=MetricUnit.Seconds, value=lag, namespace=metrics.namespace
        ) as one:
            one.add_dimension(name="Source", value=source)
    for behind in reads.index_behind:
        metrics.add_metric(name="IndexBehindSeconds", unit=MetricUnit.Seconds, value=behind)
    for dimension, counts in (("Kind", stats.findings), ("Outcome", stats.repairs)):
        name = "Findings" if dimension == "Kind" else "Repairs"
        for label, n in counts.items():
            with single_metric(name=name, unit=count, value=n, namespace=metrics.namespace) as one:
                one.add_dimension(name=dimension, value=label)
