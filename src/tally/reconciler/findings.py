"""Findings: what the reconciler found wrong, with the evidence and the repair outcome.

The alert body and message attributes are a public contract (docs/alerts.md): subscribers
filter on ``kind``, ``rule``, ``severity`` and ``repair``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from boto3.dynamodb.types import Binary

Kind = Literal[
    "drift", "gap", "duplicate", "counter_behind", "invalid_counter", "ttl_removal", "orphans"
]
RepairStatus = Literal["applied", "skipped", "failed", "dry_run", "disabled"]
Severity = Literal["info", "warning", "critical"]

SEVERITY: dict[Kind, Severity] = {
    "drift": "warning",
    "gap": "warning",
    "duplicate": "critical",
    "counter_behind": "critical",  # the next allocation would collide with a member
    "invalid_counter": "critical",  # every writer of that parent now fails
    "ttl_removal": "info",
    "orphans": "warning",
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
    detail: str = ""
    revision: Any = None
    detected_at: str = field(default_factory=lambda: now_iso())
    first_seen: str | None = None
    repair: Repair | None = None

    @property
    def severity(self) -> Severity:
        return SEVERITY[self.kind]

    @property
    def finding_id(self) -> str:
        """Stable across redelivery: the same broken state gives the same id."""
        basis = [
            self.kind,
            self.rule,
            self.table,
            self.key,
            self.attribute,
            _plain(self.stored),
            _plain(self.actual),
            _plain(self.revision),
        ]
        text = json.dumps(basis, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def with_repair(self, repair: Repair) -> Finding:
        return replace(self, repair=repair)

    def body(self) -> dict[str, Any]:
        """The alert body (JSON), as documented in docs/alerts.md."""
        repair = self.repair or Repair("skipped", "no repair attempted")
        body: dict[str, Any] = {
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
            "evidence": [e.as_json() for e in self.evidence],
            "repair": repair.as_json(),
        }
        if self.number is not None:
            body["number"] = self.number
        if self.detail:
            body["detail"] = self.detail
        if self.first_seen:
            body["first_seen"] = self.first_seen
        return body

    def subject(self) -> str:
        """A readable SNS Subject (at most 100 characters, as SNS requires)."""
        where = "/".join(self.key.values())
        repair = self.repair.status if self.repair else "skipped"
        if self.number is not None:
            what = f"number {self.number}"
        else:
            what = f"stored {_short(self.stored)}, actual {_short(self.actual)}"
        text = f"[tally] {self.kind} on {self.rule} {where}: {what} (repair {repair})"
        return text if len(text) <= 100 else text[:97] + "..."

    def message_attributes(self) -> dict[str, dict[str, str]]:
        repair = self.repair.status if self.repair else "skipped"
        values = {"kind": self.kind, "rule": self.rule, "severity": self.severity, "repair": repair}
        return {name: {"DataType": "String", "StringValue": v} for name, v in values.items()}


def timestamp(value: Any) -> str | None:
    """A stream record's ApproximateCreationDateTime (epoch seconds) as ISO 8601."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, int | float | Decimal):
        return datetime.fromtimestamp(float(value), UTC).isoformat().replace("+00:00", "Z")
    return str(value)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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


def _short(value: Any) -> str:
    text = json.dumps(_plain(value), default=str)
    return text if len(text) <= 16 else text[:13] + "..."
