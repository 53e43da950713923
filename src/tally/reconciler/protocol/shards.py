"""A counter split per Region (a rule's ``split = "region"``, docs/global-tables.md): what it
holds, and what its repair writes.

Each Region's writers add to a shard item of that Region's own beside the parent; last writer
wins per item, and only one Region writes each shard, so no increment is lost to another
Region's. The counter is the parent's own counter attribute (a base: what it held before the
split; the writers leave it) plus every shard's. A repair adds the difference to the home
Region's own shard, the one shard the home Region's writers write anyway.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tally.core.numbers import add, exact_sum, representable, subtract

# (Region, its shard's counter as read): None where the shard, or its counter, is absent.
Shards = tuple[tuple[str, Any], ...]


def part(value: Any) -> bool:
    """A value a base or a shard may hold: absent (None, read as 0) or a finite number. A
    count's shard may be negative (a Region removes children another Region made): only the
    total is judged whole and not negative."""
    return value is None or (isinstance(value, Decimal) and value.is_finite())


def total(base: Any, shards: Shards) -> Any:
    """The counter a split parent holds: its base and every shard's, exactly; or, where a
    part holds no number, that part's value (judged as an invalid counter)."""
    parts = [base, *(value for _, value in shards)]
    for value in parts:
        if not part(value):
            return value
    return exact_sum(value for value in parts if value is not None)


def home_after(home: Any, stored: Decimal, truth: Decimal) -> Decimal | None:
    """What the home Region's shard holds after a repair of a split counter that holds
    ``stored`` where its children make ``truth``: its own value plus the difference. None
    when DynamoDB could not hold that exactly (no repair is written)."""
    value = add(home if isinstance(home, Decimal) else Decimal(0), subtract(truth, stored))
    return value if representable(value) else None


def described(base: Any, shards: Shards) -> str:
    """The parts of a split counter, for a finding's detail."""
    parts = ", ".join(f"{region}: {_shown(value)}" for region, value in shards) or "none"
    return f"split per Region: base {_shown(base)}; shards {parts}"


def _shown(value: Any) -> str:
    if value is None:
        return "absent"
    return str(value) if isinstance(value, Decimal) else f"a {type(value).__name__}"
