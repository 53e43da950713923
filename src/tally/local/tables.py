"""The one table every ``tally`` command draws (audit, alerts, rules check, the demo)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text


def plain(value: Any) -> str:
    return "-" if value is None else str(value)


def pattern(key: Mapping[str, Any]) -> str:
    """A key or key pattern as the command line writes it: PK=POST#a91f,SK=META."""
    return ",".join(f"{k}={v}" for k, v in key.items())


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    right: Sequence[str] = (),
    widths: Mapping[str, int] | None = None,
    header: bool = True,
) -> Table:
    """The one table every command draws: ``columns`` named, ``right`` ones right-aligned,
    cells shown as plain text (key values are data, never markup). ``widths`` fixes columns'
    widths (long values fold inside them), so tables printed one after another line up."""
    drawn = Table(box=box.SIMPLE, show_header=header)
    for name in columns:
        width = (widths or {}).get(name)
        drawn.add_column(
            name,
            justify="right" if name in right else "left",
            width=width,
            overflow="fold",
        )
    for row in rows:
        drawn.add_row(*(Text(plain(cell)) for cell in row))
    return drawn


def alert_row(body: Mapping[str, Any]) -> list[Any]:
    """An alert (docs/alerts.md) as a row of ``ALERT_COLUMNS``."""
    repair = body.get("repair")
    status = repair.get("status") if isinstance(repair, Mapping) else repair
    key = body.get("key")
    where = pattern(key) if isinstance(key, Mapping) else key
    if "number" in body:
        where = f"{where} #{body['number']}"
        if "through" in body:
            where = f"{where}..{body['through']}"
    return [
        body.get("kind"),
        body.get("rule"),
        where,
        body.get("stored"),
        body.get("actual"),
        body.get("severity"),
        status,
    ]


ALERT_COLUMNS = ("kind", "rule", "parent", "stored", "actual", "severity", "repair")
# `tally alerts --follow` prints each poll's alerts as a table of its own: fixed widths keep
# them aligned, a long key folding inside its column.
ALERT_WIDTHS = {
    "kind": 16,
    "rule": 16,
    "parent": 36,
    "stored": 22,
    "actual": 12,
    "severity": 8,
    "repair": 9,
}
