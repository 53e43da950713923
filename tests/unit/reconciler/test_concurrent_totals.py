"""A batch's item collections count into their own totals, added up when each ends: the sum
equals one set of totals counted alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.stats import Outcome, Stats


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


outcomes = st.lists(st.sampled_from(list(Outcome)), max_size=12)


@settings(max_examples=1000, deadline=None)
@given(outcomes, outcomes)
def test_outcomes_counted_in_shares_equal_outcomes_counted_together(
    first: list[Outcome], second: list[Outcome]
) -> None:
    together, merged = Stats(), Stats()
    together.count(first + second)
    for share_outcomes in (first, second):
        share = Stats()
        share.count(share_outcomes)
        merged.merge(share)
    assert merged == together
    seen = first + second
    assert together.balanced == seen.count(Outcome.PROVED)
    assert together.carried == seen.count(Outcome.CARRIED)
    assert together.deferred == seen.count(Outcome.DEFERRED)
    assert together.ttl_decrements == seen.count(Outcome.DECREMENTED)
    checked = [o for o in seen if o in (Outcome.PROVED, Outcome.CONSISTENT, Outcome.CHECKED)]
    assert together.checked == len(checked)
    assert together.consistent == len(checked) - seen.count(Outcome.CHECKED)


@settings(max_examples=1000, deadline=None)
@given(outcomes)
def test_a_verification_reached_the_table_unless_the_stream_alone_settled_it(
    seen: list[Outcome],
) -> None:
    """Proved, carried and a TTL decrement need no alert flush; anything judged, deferred or
    left to a recheck may have alerts waiting in the outbox."""
    stream_only = {Outcome.PROVED, Outcome.CARRIED, Outcome.DECREMENTED}
    assert Outcome.reached_table(seen) == any(o not in stream_only for o in seen)
