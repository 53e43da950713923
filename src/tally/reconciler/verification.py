"""The reconciler's one door for handlers, rechecks, the full audit, replay and the local pump.

The protocol's steps, in docs/verification.md's order, live in the rooms below: in
``checks``, ``groups`` (1), ``carry_book`` (1b), ``counts`` (2), ``followups`` (parents that are
gone, and what else a judgement leads to but a write) and ``sequences`` (4), and ``batches``
(item collections at once); ``repair.repairer`` (3); ``report.reporter`` (5). Their decisions
are ``protocol``'s. They
append what they came to (``stats.Outcome``) to a list, counted here and by the runner.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from botocore.exceptions import ClientError

from tally.core.dynamodb import TransactionFailedError
from tally.reconciler.checks.batches import CollectionRunner, Deadline, confirm_own_writes
from tally.reconciler.checks.carry_book import CarryBook, CarryId
from tally.reconciler.checks.counts import Counts
from tally.reconciler.checks.followups import Followups
from tally.reconciler.checks.groups import GroupVerifier
from tally.reconciler.checks.links import ReplicationLinks
from tally.reconciler.checks.looks import Looks
from tally.reconciler.checks.regions import Contention, RegionLosses
from tally.reconciler.checks.sequences import Sequences
from tally.reconciler.findings import Finding, Off
from tally.reconciler.protocol.batching import item_collections
from tally.reconciler.protocol.regions import GlobalMode
from tally.reconciler.repair.policy import RepairPolicy
from tally.reconciler.repair.repairer import Repairer
from tally.reconciler.report.alerts import AlertPublisher
from tally.reconciler.report.rechecks import Recheck, RecheckQueue
from tally.reconciler.report.reporter import Reporter
from tally.reconciler.report.scheduling import PendingLooks, Scheduler, Settle
from tally.reconciler.stats import Stats, StatsBook
from tally.reconciler.store.parts import Store
from tally.reconciler.stream.changes import Claim
from tally.reconciler.stream.grouping import group_records
from tally.reconciler.table.tally_table import TallyTable
from tally.rules import AnyRule, Key, RuleSet, SequenceRule, TallyRule


class Reconciler:
    """Verifies stream batches and sequence rechecks against the table's children.

    Its modes are fixed at construction: ``policy`` (repairs allowed, dry run, budget),
    ``alerting`` (False: an operator's dry run that only shows findings, nothing recorded
    or sent) and ``carrying`` (False for a replay, whose records may be older than what the
    carry already folded, and under a ParallelizationFactor above 1, where an item
    collection's records may arrive out of order in concurrent batches).
    """

    def __init__(
        self,
        rules: RuleSet,
        table: TallyTable,
        store: Store,
        alerts: AlertPublisher,
        rechecks: RecheckQueue,
        policy: RepairPolicy,
        settle: Settle | None = None,
        remind_seconds: int = 0,
        carry_seconds: int = 5,
        open_carries: set[CarryId] | None = None,
        pending_looks: PendingLooks | None = None,
        carrying: bool = True,
        concurrency: int = 1,
        alerting: bool = True,
        regions: GlobalMode | None = None,
    ):
        self.rules, self.table, self.store = rules, table, store
        self._queue, self._policy = rechecks, policy
        book = self._book = StatsBook()
        settle = settle or Settle()
        pending = (table.name, pending_looks) if pending_looks is not None else None
        scheduler = self._scheduler = Scheduler(
            rechecks, store.watermarks, book, settle, carry_seconds, pending
        )
        log, standing, outbox = store.log, store.standing, store.outbox
        reporter = self._reporter = Reporter(
            log,
            standing,
            outbox,
            alerts,
            book,
            alerting=alerting,
            remind_seconds=remind_seconds,
            switches=None if policy.switches is None else policy.switches.as_json(),
        )
        followups = Followups(reporter, scheduler)
        apart = regions is not None and regions.strong
        home = regions is not None and regions.at_home
        repairer = self._repairer = Repairer(
            table.writes,
            log,
            standing,
            outbox,
            policy,
            reporter,
            apart=apart,
            home=regions.home if regions is not None and home else None,
            regions=regions.regions if regions is not None else (),
        )
        counts = self._counts = Counts(table.parents, repairer, followups, store.recent)
        contention = Contention(regions, log, table.parents) if regions and home else None
        links = self._links = (
            None
            if regions is None
            else ReplicationLinks(
                regions, table.heartbeats, store.links, reporter, book, table.name
            )
        )
        self._looks = Looks(
            counts, table.parents, followups, store.recent, contention, links if home else None
        )
        sequences = self._sequences = Sequences(
            table.parents,
            table.members,
            store.watermarks,
            repairer,
            followups,
            links if home else None,
        )
        carries = self._carries = CarryBook(store.carries, scheduler, open_carries)
        self._groups = GroupVerifier(counts, sequences, carries, carrying=carrying)
        self._runner = CollectionRunner(book, concurrency)
        # A Global Table: this Region reads its own losses, and judges only its parents.
        self._regions = (
            None
            if regions is None
            else RegionLosses(
                regions, rules, table.client, table.name, reporter, scheduler.send, links
            )
        )

    # --- modes and outcomes, read-only ---------------------------------------------------

    @property
    def regions(self) -> GlobalMode | None:
        return None if self._regions is None else self._regions.mode

    @property
    def rechecks(self) -> RecheckQueue:
        return self._queue

    @property
    def policy(self) -> RepairPolicy:
        return self._policy

    @property
    def alerting(self) -> bool:
        return self._reporter.alerting

    @property
    def carrying(self) -> bool:
        return self._groups.carrying

    @property
    def concurrency(self) -> int:
        return self._runner.concurrency

    @property
    def stats(self) -> Stats:
        """What this invocation did; inside a concurrent item collection's work, its share."""
        return self._book()

    @property
    def log(self) -> list[Finding]:
        """The findings this reconciler made, in order."""
        return self._reporter.log

    @property
    def off(self) -> list[Off]:
        """Every parent found off, alerted now or standing from before."""
        return self._reporter.off

    # --- the stream, and rechecks ----------------------------------------------------------

    def verify_batch(self, records: Iterable[Any], deadline: Deadline | None = None) -> list[str]:
        """Verify one stream batch; return the sequence numbers to report as failed."""
        if self._regions is not None and self._links is not None:
            records = list(records)
            self._links.hear(records)
            self._regions.read_losses(records)
            records = self._regions.homed_here(records)
        batch = group_records(records, self.rules)
        stats = self.stats
        stats.records += batch.records
        stats.skipped += batch.skipped
        stats.malformed += len(batch.malformed)
        concurrency = self._runner.concurrency
        own, retry = confirm_own_writes(
            batch,
            self.rules,
            self.store.log,
            self._book,
            deadline,
            concurrency,
            self._repairer.apart,
        )
        finished, unfinished = self._finish_repairs(own)
        collections = item_collections(
            (g for g in batch.groups.values() if g.rule.repair != "off"),
            self.rules.table.partition_key,
        )
        verify, needs_no_table = self._groups.verify, self._groups.needs_no_table
        failed, alerts_pending = self._runner.run(collections, verify, needs_no_table, deadline)
        if (alerts_pending or finished) and not (deadline is not None and deadline.near()):
            self.flush_alerts()
        return sorted(failed + unfinished + retry, key=int)

    def _finish_repairs(self, own: list[Claim]) -> tuple[bool, list[str]]:
        """A repair written apart (MRSC) that did not live to log itself is finished by its
        write's record: whether any was, and the records to retry whose finish failed."""
        if not self._repairer.apart:
            return False, []
        finished, unfinished = False, []
        for claim in own:
            try:
                finished |= self._repairer.finish_claimed(claim.marker)
            except (ClientError, TransactionFailedError) as error:
                self._book().errors.append(f"finish {claim.marker}: {error}")
                unfinished.append(claim.sequence_number)
        return finished, unfinished

    def recheck(self, recheck: Recheck) -> None:
        """The authoritative check of one parent or sequence, after its grace period."""
        if recheck.lost is not None:
            if self._regions is not None:  # a table made single-Region since: nothing to judge
                self._regions.judge_lost(recheck)
                self.flush_alerts()
            return
        rule = self.rules[recheck.rule]
        key = dict(recheck.key)
        with self._book.counting() as done:
            if isinstance(rule, SequenceRule):
                self._sequences.recheck(rule, recheck, done)
            elif recheck.carry_since and rule.lag_seconds is None and rule.through is None:
                since, through = recheck.carry_since, recheck.carry_through
                if not self._carries.recheck(rule, key, since, through, self._counts.recount, done):
                    return  # nothing left to recount: no read beyond the carry's
            else:
                # A carry recheck left from before a lag or an index was set is judged as such.
                self._looks.verify(rule, key, recheck, done)
        self.flush_alerts()

    # --- for the full audit ----------------------------------------------------------------

    def audit_parent(self, rule: TallyRule, key: Key) -> None:
        """Recount one parent as its stream batch would (an aggregated one: a lag later; one
        whose children are found through an index: confirmed a grace later)."""
        with self._book.counting() as done:
            self._looks.verify(rule, key, None, done)

    def schedule_recheck(self, rule: AnyRule, key: Key, counter_seen: int, reason: str) -> None:
        self._scheduler.schedule(rule, key, counter_seen, reason)

    def send_recheck(self, recheck: Recheck, delay: int) -> None:
        """A recheck an inline audit held, sent to the queue after all."""
        self._scheduler.send(recheck, delay)

    def hold_cascade_rechecks(self, held: list[tuple[Recheck, int]] | None) -> None:
        """Second looks for a cascade go to ``held`` (an inline audit waits them out), or,
        with None, to the queue."""
        self._scheduler.held = held

    def sequence_horizon(self, rule: SequenceRule, key: Key) -> Any:
        """The sequence's end as of now: its counter, or (no counter) its highest member."""
        return self._sequences.sequence_horizon(rule, key)

    def sequence_epoch(self, rule: SequenceRule, key: Key) -> int:
        """The life of the sequence's counter item a horizon read now belongs to."""
        return self.store.watermarks.sequence_state(rule.name, key)[1]

    def rebuild_ledger(self, rule: SequenceRule, scanned: list[tuple[int, Key]]) -> int:
        """The member ledger made to agree with a scan; the highest number dropped (0: none)."""
        return self._sequences.rebuild_ledger(rule, scanned)

    def alert_unrepaired(self, finding: Finding) -> None:
        """A finding no recount can see (an item the index cannot hold): alerted, never
        repaired."""
        self._reporter.alert_unrepaired(finding)

    def flush_alerts(self) -> None:
        """Send what an earlier failure left in the outbox; a failure here waits for the next."""
        self._reporter.flush_alerts()

    def standing_state(self, start: int = 0) -> list[Off]:
        """Every parent found off (from ``off[start]`` on), once each, with its standing."""
        return self._reporter.standing_state(start)
