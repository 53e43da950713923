"""What the writers leave on a multi-Region table (a Global Table) so that a Region can tell,
from its own stream, that a write of its own was overwritten by last-writer-wins.

- ``tallyOrigin``: the Region of the write that made this version of the item.
- ``tallyChildId``: made once, when a writer creates a child or member: ``<Region>:<random>``.
  Another Region's child under the same key (a number handed out twice) has another id.
- ``tallyWrites@<Region>`` on a parent: how many writes that Region's writers made to its
  counters, in this version's history. A version from another Region that replaces one of
  ours and holds fewer of ours lost the difference.

- ``tallyBeatAt`` on a Region's heartbeat item (``tally#heartbeat#<Region>``, written by that
  Region's stack on a schedule, and by no one else): when, by that Region's clock, it last
  beat. Another Region reads from its arrival how far replication from there lags, and from
  its age in its own replica whether the link stalled.

- ``tallyHome`` on a parent or sequence counter (set by the team, not the writers): the one
  Region whose writers may change it. A writer in another Region is refused before anything
  is written, so its increments and numbers cannot race another Region's (prevention).

A single-Region table never carries them: the writers stamp only when given a Region.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

ORIGIN = "tallyOrigin"
CHILD_ID = "tallyChildId"
HOME = "tallyHome"
BEAT_AT = "tallyBeatAt"
_WRITES = "tallyWrites@"
HEARTBEAT_PREFIX = "tally#heartbeat#"


def heartbeat_key(partition_key: str, sort_key: str | None, region: str) -> dict[str, str]:
    """The key of ``region``'s heartbeat item on a table keyed by these attributes."""
    key = {partition_key: f"{HEARTBEAT_PREFIX}{region}"}
    return key | ({sort_key: "tally#heartbeat"} if sort_key else {})


def heartbeat_image(record: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The NewImage (wire format) of a Lambda stream record that writes a heartbeat item, or
    None: the cheap test, made before anything is deserialized."""
    new = (record.get("dynamodb") or {}).get("NewImage")
    return new if isinstance(new, Mapping) and BEAT_AT in new else None


def heartbeat(image: Mapping[str, Any] | None) -> tuple[str, Decimal] | None:
    """The Region and time (epoch seconds, its clock) of the heartbeat an item image is, if
    it is one."""
    if not image:
        return None
    origin, at = image.get(ORIGIN), image.get(BEAT_AT)
    if not isinstance(origin, str) or not isinstance(at, Decimal) or not at.is_finite():
        return None
    return origin, at


def writes(region: str) -> str:
    return f"{_WRITES}{region}"


def writing_regions(item: Mapping[str, Any]) -> tuple[str, ...]:
    """The Regions whose writers wrote a parent's counters, by its ``tallyWrites@`` stamps."""
    return tuple(
        sorted(
            name[len(_WRITES) :]
            for name, count in item.items()
            if name.startswith(_WRITES) and len(name) > len(_WRITES) and _positive(count)
        )
    )


def _positive(count: object) -> bool:
    if isinstance(count, Decimal):
        return count.is_finite() and count > 0
    return isinstance(count, int) and not isinstance(count, bool) and count > 0


def created_in(child_id: object) -> str | None:
    """The Region a child id was made in, None if it is not one."""
    if not isinstance(child_id, str) or ":" not in child_id:
        return None
    return child_id.split(":", 1)[0] or None


def is_regional(name: str) -> bool:
    """Whether an attribute is one of these (kept out of a child's payload and a user's
    attributes)."""
    return name in (ORIGIN, CHILD_ID, HOME, BEAT_AT) or name.startswith(_WRITES)
