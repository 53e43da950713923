"""Running one stream batch: its claimed records confirmed, then its item collections
verified, each up to ``concurrency`` at once (a collection's groups in order), within the
invocation's deadline."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TypeVar

from botocore.exceptions import ClientError

from tally.reconciler.stats import Done, Outcome, StatsBook
from tally.reconciler.store.log import FindingLog
from tally.reconciler.stream.changes import Batch, Claim, Group
from tally.reconciler.stream.grouping import fold_record
from tally.rules import RuleSet

# One group's verification, appending what it came to (past the stream to the table: alerts
# of its repairs may wait in the outbox).
VerifyGroup = Callable[[Group, Done], None]
# Whether a collection reads nothing from the table (every group proves itself).
NeedsNoTable = Callable[[list[Group]], bool]

T = TypeVar("T")

# Python runs signal handlers in the main thread only, but the kernel may deliver a
# process's signal (a local pump's Ctrl-C) to any thread, a worker included: the main thread
# waits on its workers in steps this long, so that it wakes to handle one a worker took.
SIGNAL_CHECK_SECONDS = 0.1


def awaited(future: Future[T]) -> T:
    """``future``'s result (or what it raised, a timeout of its own included), the waiting
    thread handling signals meanwhile."""
    while not future.done():
        wait([future], timeout=SIGNAL_CHECK_SECONDS)
    return future.result()


@dataclass(frozen=True)
class Deadline:
    """When to stop starting groups: the invocation's time left, and what to keep in hand."""

    remaining_seconds: Callable[[], float]
    reserve_seconds: float = 20.0

    def near(self) -> bool:
        return self.remaining_seconds() < self.reserve_seconds


def confirm_own_writes(
    batch: Batch,
    rules: RuleSet,
    store: FindingLog,
    stats: StatsBook,
    deadline: Deadline | None,
    concurrency: int = 1,
    retry_unconfirmed: bool = False,
) -> tuple[list[Claim], list[str]]:
    """Records with a fresh repair marker: ours only if the audit table logged the marker;
    the claims confirmed, and the sequence numbers of the records to retry.

    Any client can write the marker attribute, so a forged or replayed one is folded
    like any other write; an unconfirmable claim is folded too (at worst a recount). The
    lookups run up to ``concurrency`` at once (each claims a marker of its own); the claims
    not confirmed are then folded in the batch's order. With ``retry_unconfirmed`` (a repair
    written apart, MRSC: its own record may be the only thing left to finish it), a claim
    whose lookup failed is not folded but retried.
    """
    errors: list[str] = []
    failed: set[str] = set()

    def confirm(claim: Claim) -> bool:
        if deadline is not None and deadline.near():
            return False  # a recount at worst
        new_image = claim.record["dynamodb"].get("NewImage") or {}
        try:
            return store.confirm_marker(claim.marker, claim.keys, new_image, claim.sequence_number)
        except ClientError as error:
            errors.append(f"marker {claim.marker}: {error}")
            failed.add(claim.sequence_number)
            return False

    claims = batch.claims
    if concurrency > 1 and len(claims) > 1:
        with ThreadPoolExecutor(min(concurrency, len(claims)), "confirm") as pool:
            futures = [pool.submit(confirm, claim) for claim in claims]
            confirmed = [awaited(future) for future in futures]
    else:
        confirmed = [confirm(claim) for claim in claims]
    retry: list[str] = []
    for claim, own in zip(claims, confirmed, strict=True):
        if own:
            batch.own_writes += 1
        elif retry_unconfirmed and claim.sequence_number in failed:
            retry.append(claim.sequence_number)
        else:
            fold_record(batch, claim.record, rules, claimed=True)
    stats().errors.extend(errors)
    stats().own_writes += batch.own_writes
    return [claim for claim, own in zip(claims, confirmed, strict=True) if own], retry


class CollectionRunner:
    """Verifies item collections: groups of one collection share items (a parent, its
    sequence, its carry), groups of different collections share nothing but this
    invocation's totals, so collections that need the table run in worker threads."""

    def __init__(self, stats: StatsBook, concurrency: int = 1):
        self._stats = stats
        # Item collections of one batch verified at once (each waits mostly on the table).
        self.concurrency = max(1, concurrency)
        self._stopping = threading.Event()  # set by an interrupt: no further group starts

    def run(
        self,
        collections: list[list[Group]],
        verify: VerifyGroup,
        needs_no_table: NeedsNoTable,
        deadline: Deadline | None,
    ) -> tuple[list[str], bool]:
        """The sequence numbers to report as failed, and whether alerts may be pending."""
        failed: list[str] = []
        alerts_pending = False
        for outcome in self._each(collections, verify, needs_no_table, deadline):
            failed += outcome[0]
            alerts_pending = alerts_pending or outcome[1]
        return failed, alerts_pending

    def _each(
        self,
        collections: list[list[Group]],
        verify: VerifyGroup,
        needs_no_table: NeedsNoTable,
        deadline: Deadline | None,
    ) -> Iterator[tuple[list[str], bool]]:
        # Collections that prove themselves read nothing: a worker would cost more than they.
        here: list[list[Group]] = []
        waiting: list[list[Group]] = []
        for groups in collections:
            needs_table = self.concurrency > 1 and not needs_no_table(groups)
            (waiting if needs_table else here).append(groups)
        if len(waiting) <= 1:  # one alone gains nothing from a worker either
            here, waiting = here + waiting, []
        for groups in here:
            yield self._collection(groups, verify, deadline)
        if not waiting:
            return
        workers = min(self.concurrency, len(waiting))
        pool = ThreadPoolExecutor(workers, thread_name_prefix="verify")
        try:
            shares = [
                pool.submit(
                    self._stats.counted,
                    lambda groups=groups: self._collection(groups, verify, deadline),
                )
                for groups in waiting
            ]
            for future in shares:
                outcome, stats = awaited(future)
                self._stats.total.merge(stats)
                yield outcome
        except BaseException:
            # An interrupt (a local pump's second Ctrl-C): no collection or group starts any
            # more; the groups under way end, and the batch is delivered again as a whole.
            self._stopping.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()

    def _collection(
        self, groups: list[Group], verify: VerifyGroup, deadline: Deadline | None
    ) -> tuple[list[str], bool]:
        failed, alerts_pending = [], False
        stats = self._stats()
        for group in groups:
            if self._stopping.is_set():
                failed.append(group.first_sequence_number)
                continue
            if deadline is not None and deadline.near():
                # Better a retried group than a lost partial batch response.
                failed.append(group.first_sequence_number)
                stats.errors.append(f"{group.rule.name} {group.parent_key}: out of time")
                continue
            stats.groups += 1
            done: Done = []
            try:
                verify(group, done)
                alerts_pending = alerts_pending or Outcome.reached_table(done)
            except Exception as error:
                alerts_pending = True  # the alert of a repair that committed may wait in the outbox
                # Throttling or an outage mid-check: retry this group's records, only them.
                failed.append(group.first_sequence_number)
                where = f"{group.rule.name} {group.parent_key}"
                stats.errors.append(f"{where}: {type(error).__name__}: {error}")
            stats.count(done)  # what it did before a failure too
        return failed, alerts_pending
