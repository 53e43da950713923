"""The rechecks the functions schedule, seen as they send them: when each comes due and why."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# SQS's delays are whole seconds and its counts approximate: a recheck is looked for this long
# after it should have come due.
DUE_MARGIN = 1.5


@dataclass(frozen=True)
class Scheduled:
    """A recheck a function sent to the recheck queue: when it comes due and why."""

    due: float  # time.time()
    delay: int
    rule: str
    key: str
    reason: str

    def describe(self, now: float) -> str:
        until = datetime.fromtimestamp(self.due).strftime("%H:%M:%S")
        left = max(0.0, self.due - now)
        return f"{self.reason} of {self.rule} {self.key}, due {until} (in {left:.0f} s)"


class RecheckSchedule:
    """The rechecks the functions schedule, seen as they send them (SQS tells only how many
    messages are delayed, not until when): what the pump waits for, and until when."""

    def __init__(self) -> None:
        self._scheduled: list[Scheduled] = []
        self._lock = threading.Lock()

    def watch(self, sqs_client: Any) -> None:
        """Note every recheck ``sqs_client`` (a function's own client) sends from now on."""
        sqs_client.meta.events.register(
            "before-parameter-build.sqs.SendMessage", self._sent, unique_id=f"pump-{id(self)}"
        )

    def _sent(self, params: Mapping[str, Any], **_: Any) -> None:
        try:
            body = json.loads(params.get("MessageBody", ""))
            key = "/".join(str(v) for v in body["key"].values())
            rule, reason = str(body["rule"]), str(body.get("reason") or "recheck")
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # not a recheck
        delay = int(params.get("DelaySeconds") or 0)
        now = time.time()
        with self._lock:  # a pump that runs for days keeps only what is still to come
            self._scheduled = [s for s in self._scheduled if s.due + DUE_MARGIN > now]
            self._scheduled.append(Scheduled(now + delay, delay, rule, key, reason))

    def waiting(self, within: float | None = None) -> list[Scheduled]:
        """Rechecks not yet looked for (due plus a margin), soonest first; with ``within``,
        only those whose delay is at most that many seconds."""
        now = time.time()
        with self._lock:
            self._scheduled = [s for s in self._scheduled if s.due + DUE_MARGIN > now]
            pending = sorted(self._scheduled, key=lambda s: s.due)
        return [s for s in pending if within is None or s.delay <= within]


def waiting_line(waiting: list[Scheduled]) -> str:
    """What the pump waits for, in one line."""
    now = time.time()
    last = waiting[-1]
    reasons = ", ".join(sorted({s.reason for s in waiting}))
    until = datetime.fromtimestamp(last.due).strftime("%H:%M:%S")
    return (
        f"waiting for {len(waiting)} recheck{'s' if len(waiting) != 1 else ''} ({reasons}) "
        f"until {until}, {max(0, last.due - now):.0f} s; next: {waiting[0].describe(now)}"
    )
