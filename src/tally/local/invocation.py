"""What one local invocation did, read from what the handler already prints.

The handlers print their JSON log lines and Powertools' EMF metrics (one JSON object per
line), as CloudWatch would keep them; ``tally invoke`` reads the lines one invocation added to
``.tally/functions.log`` and says, in a few lines, what the function did with the event.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tally.local.recheck_schedule import Scheduled


@dataclass
class Invocation:
    """The numbers and log lines of one invocation."""

    metrics: dict[str, float] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        """Whether the function verified anything (the reconciler's and recheck's metrics)."""
        return "RecordsSeen" in self.metrics or "ParentsChecked" in self.metrics


def read(lines: Iterable[str]) -> Invocation:
    """The metrics (summed over EMF documents) and findings the ``lines`` hold; any line that
    is not one of the handler's JSON objects is left out."""
    seen = Invocation()
    for line in lines:
        try:
            document = json.loads(line)
        except ValueError:
            continue
        if not isinstance(document, dict):
            continue
        if isinstance(document.get("_aws"), dict):
            _add_metrics(seen.metrics, document)
        elif document.get("message") == "finding":
            seen.findings.append(document)
        elif document.get("level") == "ERROR":
            seen.errors.append(str(document.get("message")))
    return seen


def _add_metrics(into: dict[str, float], document: Mapping[str, Any]) -> None:
    directives = document["_aws"].get("CloudWatchMetrics")
    for directive in directives if isinstance(directives, list) else []:
        for metric in directive.get("Metrics", []) if isinstance(directive, dict) else []:
            name = metric.get("Name") if isinstance(metric, dict) else None
            value = document.get(name) if isinstance(name, str) else None
            values = value if isinstance(value, list) else [value]
            for number in values:
                if isinstance(number, int | float) and not isinstance(number, bool):
                    into[str(name)] = into.get(str(name), 0.0) + number


def _n(count: float, one: str, many: str | None = None) -> str:
    whole = int(count)
    return f"{whole} {one if whole == 1 else (many or one + 's')}"


def _where(key: Any) -> str:
    if isinstance(key, Mapping):
        return ",".join(f"{k}={v}" for k, v in key.items())
    return str(key)


def summary(
    seen: Invocation,
    rechecks: list[Scheduled],
    alerts: list[str],
    now: float,
    stream: bool = True,
) -> list[str]:
    """What the invocation did, one line each: records, groups, findings, rechecks, alerts.

    ``alerts`` are the alerts it published, as lines; "nothing alerted" is said only when
    nothing was and the function verified something. ``stream``: the function takes stream
    records (the reconciler); otherwise (the recheck, the audits) only parents checked count.
    """
    m = defaultdict(float, seen.metrics)
    lines = []
    if "RecordsSeen" in m and stream:
        skipped = [
            f"{int(m['MalformedRecords'])} malformed (no readable keys or images)"
            if m["MalformedRecords"]
            else "",
            f"{int(m['RecordsSkipped'])} covered by no rule" if m["RecordsSkipped"] else "",
            f"{int(m['OwnWrites'])} the reconciler's own repair writes" if m["OwnWrites"] else "",
        ]
        why = ", ".join(part for part in skipped if part)
        lines.append(
            f"records: {int(m['RecordsSeen'])} seen, "
            + (f"skipped: {why}" if why else "none skipped")
        )
    if seen.verified and not stream:
        lines.append(
            f"parents checked: {int(m['ParentsChecked'])} ({_n(m['Recounts'], 'recount')})"
        )
    elif seen.verified:
        groups = [
            f"{int(m['GroupsBalanced'])} balanced (no read)",
            f"{int(m['GroupsCarried'])} carried to a later batch",
            _n(m["ParentsChecked"], "parent checked", "parents checked")
            + f" ({_n(m['Recounts'], 'recount')})",
        ]
        if m["Deferred"]:
            groups.append(_n(m["Deferred"], "deferred"))
        lines.append("groups: " + ", ".join(groups))
    for finding in seen.findings:
        repair = finding.get("repair") or "none"
        lines.append(
            f"finding: {finding.get('kind')} of {finding.get('rule')} at "
            f"{_where(finding.get('key'))}, repair {repair}"
        )
    for recheck in sorted(rechecks, key=lambda r: r.due):
        due = datetime.fromtimestamp(recheck.due, UTC)
        lines.append(
            f"recheck scheduled: {recheck.reason} of {recheck.rule} {recheck.key}, due "
            f"{due:%H:%M:%S} UTC (in {max(0.0, recheck.due - now):.0f} s): "
            "`tally pump --until-settled` delivers it"
        )
    for error in seen.errors:
        lines.append(f"error: {error}")
    lines.extend(f"alerted: {alert}" for alert in alerts)
    if not alerts and seen.verified:
        lines.append("nothing alerted" + _why_nothing(seen, rechecks, stream))
    return lines


def _why_nothing(seen: Invocation, rechecks: list[Scheduled], stream: bool) -> str:
    m = defaultdict(float, seen.metrics)
    if not stream:
        return (
            ""
            if seen.findings or rechecks
            else ": what it checked agrees with the table as it is now "
            "(an item it does not hold finds nothing)"
        )
    if seen.findings:
        return (
            f" by this invocation for the {_n(len(seen.findings), 'finding')} above "
            "(a finding that stands is alerted once, not at every look)"
        )
    if seen.errors:
        return ": the groups left for retry are verified when Lambda delivers them again"
    if rechecks:
        return " yet: the recheck decides"
    if "RecordsSeen" in m and not m["RecordsSeen"]:
        return ": the event holds no stream record"
    if "RecordsSeen" in m and not (
        m["GroupsBalanced"] or m["ParentsChecked"] or m["GroupsCarried"]
    ):
        return ": no record of the event is a counter or child any rule covers"
    if m["ParentsChecked"]:
        return (
            ": the counters checked agree with the table as it is now (the reconciler verifies "
            "the table, not the event's images: an event about items the table does not hold, "
            "or holds already repaired, finds nothing)"
        )
    return ": every group balanced"
