"""Findings: what the reconciler found wrong, with the evidence and the repair outcome.

The alert body and message attributes are a public contract (docs/alerts.md): subscribers
filter on ``kind``, ``rule``, ``severity`` and ``repair``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from boto3.dynamodb.types import Binary

from tally.core.numbers import NULL, subtract
from tally.core.timefmt import epoch_iso, iso, now_iso
from tally.reconciler.protocol.judgement import Kind
from tally.rules import Key, SumRule

RepairStatus = Literal["applied", "skipped", "failed", "dry_run", "disabled"]
Severity = Literal["info", "warning", "critical"]

# An alert stays far below SNS's 256 KB however many records a group held.
MAX_EVIDENCE = 20

SEVERITY: dict[Kind, Severity] = {
    "drift": "warning",
    "gap": "warning",
    "duplicate": "critical",
    "counter_behind": "critical",  # the next allocation would collide with a member
    "invalid_counter": "critical",  # every writer of that parent now fails
    "ttl_removal": "info",
    "orphans": "warning",
    "malformed": "warning",  # a child's amount is not a number: it counts 0
    "unrepresentable": "critical",  # the truth needs more digits than any counter holds
    "unindexed": "warning",  # keyed as a child, but its index cannot see it: counts 0
    # Global Tables: a child of this Region's replaced by another Region's under its key (a
    # number handed out twice, or a like made in two Regions): its payload is gone.
    "overwritten": "critical",
    # Global Tables: a parent written from several Regions whose increments keep losing to
    # last writer wins: escalated instead of repaired again and again.
    "contended": "critical",
    # Global Tables: replication from another Region stopped delivering (its heartbeat went
    # silent) or was never heard: the home Region's settled findings wait for it.
    "replication_stalled": "warning",
}


@dataclass(frozen=True)
class Evidence:
    """One stream record behind a finding: keys and counter values, never whole images."""

    sequence_number: str
    event: str
    keys: dict[str, str]
    old: Any = None
    new: Any = None
    at: Any = None  # the record's ApproximateCreationDateTime, formatted when shown

    def as_json(self) -> dict[str, Any]:
        body = {"sequence_number": self.sequence_number, "event": self.event, "keys": self.keys}
        if self.old is not None or self.new is not None:
            body |= {"old": _plain(self.old), "new": _plain(self.new)}
        at = timestamp(self.at)
        if at is not None:
            body["at"] = at
        return body


@dataclass(frozen=True)
class Repair:
    """What happened to a finding's repair, and why."""

    status: RepairStatus
    reason: str
    before: Any = None
    after: Any = None

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"status": self.status, "reason": self.reason}
        if self.status in ("applied", "dry_run"):
            body |= {"before": _plain(self.before), "after": _plain(self.after)}
        return body


@dataclass(frozen=True)
class Finding:
    """One broken invariant on one parent (or counter)."""

    kind: Kind
    rule: str
    table: str
    key: dict[str, str]
    attribute: str
    stored: Any
    actual: Any
    evidence: tuple[Evidence, ...] = ()
    number: int | None = None
    through: int | None = None  # a gap summarised as one range: number..through
    # An event's identity: its stream position (a counter going down), the lost child's id
    # (a child overwritten).
    occurrence: str | None = None
    detail: str = ""
    revision: Any = None
    detected_at: str = field(default_factory=lambda: now_iso())
    first_seen: str | None = None
    repair: Repair | None = None
    # The repair switches as the alert shows them (Switches.as_json), when they were read.
    switches: dict[str, Any] | None = field(default=None, compare=False)
    # On a Global Table: the Region whose reconciler found it (None: a single-Region table).
    region: str | None = None

    @property
    def severity(self) -> Severity:
        return SEVERITY[self.kind]

    @property
    def finding_id(self) -> str:
        """The broken state's identity: the same state, redelivered or rechecked, has one id.

        A gap or duplicate is one number (or range); a count or sum finding is its offset
        (stored - actual), so a standing drift keeps its id while legitimate writes move
        both sides, and a new drift on the same parent is news.
        """
        return _digest(
            [
                self.kind,
                self.rule,
                self.table,
                self.key,
                self.attribute,
                self.number,
                self.through,
                self.occurrence,
                _plain(self._state()),
            ]
        )

    def _state(self) -> Any:
        if self.kind in ("drift", "ttl_removal") and _numbers(self.stored, self.actual):
            return subtract(self.stored or Decimal(0), self.actual)
        if self.kind in ("gap", "duplicate", "orphans", "replication_stalled"):
            return None  # (a stalled link: one finding per link, standing until it is live)
        return [self.stored, self.actual]

    @property
    def alert_key(self) -> str:
        """What one alert says: this finding with this repair outcome."""
        repair = self.repair.status if self.repair else "skipped"
        return _digest([self.finding_id, repair])

    def alert_id(self, occurrence: str) -> str:
        """One alert of this finding and outcome: a subscriber drops a repeated copy by it."""
        return _digest([self.alert_key, occurrence])

    def with_repair(self, repair: Repair) -> Finding:
        return replace(self, repair=repair)

    def with_switches(self, switches: dict[str, Any] | None) -> Finding:
        return replace(self, switches=switches)

    def body(self, alert_id: str | None = None) -> dict[str, Any]:
        """The alert body (JSON), as documented in docs/alerts.md."""
        repair = self.repair or Repair("skipped", "no repair attempted")
        body: dict[str, Any] = {
            "alert_id": alert_id or self.alert_key,
            "finding_id": self.finding_id,
            "kind": self.kind,
            "severity": self.severity,
            "rule": self.rule,
            "table": self.table,
            "key": self.key,
            "attribute": self.attribute,
            "stored": _plain(self.stored),
            "actual": _plain(self.actual),
            "detected_at": self.detected_at,
            "evidence": [e.as_json() for e in self.evidence[:MAX_EVIDENCE]],
            "repair": repair.as_json(),
        }
        if len(self.evidence) > MAX_EVIDENCE:
            body["evidence_omitted"] = len(self.evidence) - MAX_EVIDENCE
        if self.number is not None:
            body["number"] = self.number
        if self.through is not None:
            body["through"] = self.through
        if self.detail:
            body["detail"] = self.detail
        if self.first_seen:
            body["first_seen"] = self.first_seen
        if self.switches is not None:
            body["switches"] = self.switches
        if self.region is not None:
            body["region"] = self.region
        return body

    def subject(self) -> str:
        """A readable SNS Subject (at most 100 characters, as SNS requires)."""
        where = "/".join(self.key.values())
        repair = self.repair.status if self.repair else "skipped"
        if self.through is not None:
            what = f"numbers {self.number}..{self.through}"
        elif self.number is not None:
            what = f"number {self.number}"
        else:
            what = f"stored {_short(self.stored)}, actual {_short(self.actual)}"
        text = f"[tally] {self.kind} on {self.rule} {where}: {what} (repair {repair})"
        # SNS takes printable ASCII only, and any client can put a line break in a key.
        text = "".join(c if " " <= c <= "~" else "?" for c in text)
        return text if len(text) <= 100 else text[:97] + "..."

    def message_attributes(self) -> dict[str, dict[str, str]]:
        repair = self.repair.status if self.repair else "skipped"
        values = {"kind": self.kind, "rule": self.rule, "severity": self.severity, "repair": repair}
        if self.region is not None:
            values["region"] = self.region
        return {name: {"DataType": "String", "StringValue": v} for name, v in values.items()}


def child_finding(
    kind: Kind, rule: str, table: str, child: Key, attribute: str, held: Any, detail: str, why: str
) -> Finding:
    """A finding on one child item, by its key, the attribute and the type it holds (never its
    value); never repaired (``why``)."""
    repair = Repair("skipped", why)
    return Finding(
        kind, rule, table, dict(child), attribute, held, None, detail=detail, repair=repair
    )


def malformed_amount(rule: SumRule, table: str, parent: Key, child: Key, held: str) -> Finding:
    """A child of a sum rule whose amount holds ``held`` (a type), not a number: it counts 0."""
    parent_text = "/".join(str(v) for v in parent.values())
    detail = f"the amount holds {held}, not a number: the sum of {parent_text} counts it as 0"
    why = "what the amount should be is a human decision"
    return child_finding("malformed", rule.name, table, child, rule.summed, held, detail, why)


@dataclass(frozen=True)
class AlertMessage:
    """One alert as SNS receives it; ``alert_id`` lets a subscriber drop a repeated copy."""

    alert_id: str
    subject: str
    body: str
    attributes: dict[str, dict[str, str]]

    @classmethod
    def of(cls, finding: Finding, alert_id: str) -> AlertMessage:
        return cls(
            alert_id,
            finding.subject(),
            json.dumps(finding.body(alert_id)),
            finding.message_attributes(),
        )


def timestamp(value: Any) -> str | None:
    """A stream record's ApproximateCreationDateTime (epoch seconds) as ISO 8601.

    A value that is no plausible time (forged, out of range) is shown as absent.
    """
    try:
        if isinstance(value, datetime):
            return iso(value)
        if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
            return epoch_iso(float(value))
    except (ArithmeticError, ValueError, OverflowError, OSError):
        return None
    return None


def shown(value: Any) -> Any:
    """A counter value fit for an alert: numbers as they are, anything else by type and size.

    A counter holding a string or a map may hold personal data; an alert never echoes it.
    """
    if value is None or isinstance(value, bool):
        return value
    if value is NULL:
        return "null"
    if isinstance(value, Decimal):
        return value if value.is_finite() else "number (not finite)"
    if isinstance(value, int):
        return Decimal(value)
    names: dict[type, str] = {str: "string", bytes: "binary", dict: "map", list: "list"}
    kind = names.get(type(value), "set" if isinstance(value, set) else type(value).__name__)
    unit = "characters" if isinstance(value, str) else "bytes" if kind == "binary" else "entries"
    size = len(value) if hasattr(value, "__len__") else 0
    return f"{kind} of {size} {unit}"


def _plain(value: Any) -> Any:
    """JSON-ready: integral Decimals become ints, other Decimals keep their exact digits."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(v) for v in value), key=str)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, Binary):
        return base64.b64encode(value.value).decode()  # type: ignore[attr-defined]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _numbers(*values: Any) -> bool:
    return all(v is None or (isinstance(v, Decimal) and v.is_finite()) for v in values)


def _digest(basis: list[Any]) -> str:
    text = json.dumps(basis, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _short(value: Any) -> str:
    text = json.dumps(_plain(value), default=str)
    return text if len(text) <= 16 else text[:13] + "..."


@dataclass(frozen=True)
class Off:
    """A parent found off: ``new`` (alerted now, or would be), ``standing`` (alerted before
    and still unrepaired) or ``unconfirmed`` (a second look decides: orphans, a lag)."""

    finding: Finding
    status: str
    alerted_at: str | None = None
