"""Step 1 for children found through an index: a balance proves nothing about them.

A transaction's edge and count may fall into different batches, and a rogue change of
another edge into the count's: that batch balances by chance (docs/verification.md,
"Children found through an index"). Whatever the records and wherever the batches end,
every group that changed such a child goes on to its look; a group of its parent's records
alone, its counter unmoved, still proves itself.
"""

from __future__ import annotations

from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.checks.groups import GroupVerifier
from tally.reconciler.stream.grouping import group_records
from tests.unit.reconciler.test_changes_indexed import RULES, STATUSES, USERS, edge, record
from tests.utils import stream_record


class NoOpenCarry:
    """No carry is open: only the group's own balance could prove it."""

    def may_be_open(self, group: Any) -> bool:
        return False


def verifier() -> GroupVerifier:
    return GroupVerifier(cast(Any, None), cast(Any, None), cast(Any, NoOpenCarry()))


images = st.one_of(st.none(), st.builds(edge, st.sampled_from(USERS), st.sampled_from(STATUSES)))
edges = st.builds(record, st.sampled_from(["dan", "eve", "fay"]), images, images).filter(
    lambda r: r["eventName"] != "INSERT" or "NewImage" in r["dynamodb"]
)


def profile(user: str, before: int, after: int) -> dict[str, Any]:
    keys = {"PK": f"USER#{user}", "SK": "PROFILE"}
    return stream_record(
        "MODIFY", keys, {"followerCount": after, "rev": 2}, {"followerCount": before, "rev": 1}
    )


counts = st.builds(profile, st.sampled_from(USERS), st.integers(0, 3), st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(edges, counts), min_size=1, max_size=12), st.data())
def test_no_group_that_changed_a_child_through_an_index_proves_itself_by_its_balance(
    records: list[dict[str, Any]], data: st.DataObject
) -> None:
    ends = sorted(data.draw(st.sets(st.integers(1, len(records)), max_size=len(records))))
    proved = verifier().proves_itself
    for start, end in zip([0, *ends], [*ends, len(records)], strict=True):
        for group in group_records(records[start:end], RULES).groups.values():
            if group.indexed_children:
                assert not proved(group)
            elif not group.counter_delta and not group.invalid and not group.unreadable:
                assert proved(group)
