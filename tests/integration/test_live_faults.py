"""Live: the pump verifies (at the template's ParallelizationFactor, 1; `make bench-live` also
runs the emulated factors 2 and 10) while writer threads write,
a fault injector breaks parents, the alert topic fails part of the time, and code "not ours"
deletes and reuses parents. Counted per run (tests/harness/live.py says how): false
negatives, false positives, lost writes and harmful writes, each expected to be 0; and the
fault -> alert latency per fault kind, printed and written as JSON to $TALLY_LIVE_REPORT
(else the test's tmp dir). Latency is reported, not asserted (on a loaded machine it is
anything): `benchmarks/live_faults.py` checks the goals over several runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tally.reconciler import runtime
from tally.rules import load_rules
from tests.harness.faults import Outage
from tests.harness.live import LIFECYCLE, LiveRun, Outcome, write_report
from tests.integration.conftest import RULES_FILE, Stack

RULES = load_rules(RULES_FILE)

# Writer threads, the pump and the injector race on purpose: it runs alone, after the
# parallel run, so that the machine's other tests are not among the racers.
pytestmark = pytest.mark.serial


def report(outcome: Outcome, name: str, tmp_path: Path) -> None:
    write_report(outcome, name, tmp_path / "live_faults.json")


def assert_clean(outcome: Outcome) -> None:
    assert outcome.false_negatives == set()
    assert outcome.false_positives == set()
    assert outcome.lost_writes == []
    assert outcome.harmful_writes == []


@pytest.mark.parametrize("factor", [1])
def test_live_verification_under_faults(stack: Stack, factor: int, tmp_path: Path) -> None:
    """Every fault kind on small and hot parents, alerted once; parents that live and are
    reused stay balanced; nothing is written where it should not be."""
    # The alert topic is down for the first publishes, and loses one response after that.
    down = Outage(runtime._clients()[1], "Publish", "down", times=2)
    run = LiveRun(stack, RULES, seed=factor, factor=factor, lifecycle=list(LIFECYCLE))
    outcome = run.run()
    down.heal()
    report(outcome, f"factor-{factor}", tmp_path)
    assert_clean(outcome)
    # The truth the lost-write check judges by came back from the application's process.
    written = [name for name in run.ledger.likes if name.startswith(("POST#live", "POST#hot"))]
    assert len(written) >= 10 and run.ledger.lines and run.ledger.numbers > 1
    assert down.failed == 2
    # Every fault has its latency; how long it was depends on the machine: reported only.
    latencies = [s for values in outcome.latencies.values() for s in values]
    assert len(latencies) == len(run.ledger.faults)
    assert set(outcome.latencies) == {"count/small", "count/hot", "sum/small", "sequence/small"}
    assert run.pump.settings.parallelization == factor
