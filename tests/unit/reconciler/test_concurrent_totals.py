"""A batch's item collections count into their own totals, added up when each ends: the sum
equals one set of totals counted alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.stats import Stats


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from(["drift", "orphans"])), max_size=8))
def test_stats_merged_from_shares_equal_one_stats_counted_alone(
    shares: list[tuple[int, str]],
) -> None:
    alone, merged = Stats(), Stats()
    for records, kind in shares:
        share = Stats(records=records, groups=1, errors=[kind])
        share.findings[kind] += 1
        share.drift_lifetimes.append(float(records))
        merged.merge(share)
        alone.records += records
        alone.groups += 1
        alone.errors.append(kind)
        alone.findings[kind] += 1
        alone.drift_lifetimes.append(float(records))
    assert merged == alone
