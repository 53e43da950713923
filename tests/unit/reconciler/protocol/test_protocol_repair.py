"""Step 3's decision of whether the settings let a repair be written: a write only when the
rule repairs automatically, repairs are on, it is no dry run and the budget is not used up;
otherwise the first refusal in that order stands."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.protocol.repair import refusal

modes = st.sampled_from(["auto", "alert", "off", "Auto", ""])


@settings(max_examples=1000, deadline=None)
@given(modes, st.booleans(), st.booleans(), st.integers(0, 5), st.integers(0, 7))
def test_a_repair_is_written_only_when_every_setting_allows_it_and_the_first_refusal_stands(
    mode: str, enabled: bool, dry_run: bool, budget: int, used: int
) -> None:
    refused = refusal("likes", mode, enabled=enabled, dry_run=dry_run, budget=budget, used=used)
    reasons = [
        ("skipped", mode != "auto"),
        ("disabled", not enabled),
        ("dry_run", dry_run),
        ("skipped", used >= budget),
    ]
    first = next((status for status, applies in reasons if applies), None)
    if first is None:
        assert refused is None
        return
    assert refused is not None and refused[0] == first
    if mode != "auto":
        assert repr(mode) in refused[1] and "'likes'" in refused[1]
    elif first == "skipped":
        assert f"budget of {budget}" in refused[1]
