"""`make demo` run after run beside busy CPUs: it must pass every time, however slow.

Run by ``make demo-under-load`` (``RUNS=20 HOGS=2`` by default). Each run is ``tally demo``
with a state directory of its own; the hogs are busy-loop processes started before the first
run and killed after the last. Prints one line per run and a summary, writes the results as
JSON, and exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT = 900


@dataclass
class Run:
    """One `tally demo` and its outcome."""

    run: int
    exit_code: int | None
    seconds: float
    load: float
    output_tail: str

    @property
    def passed(self) -> bool:
        return self.exit_code == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=2, help="busy-loop processes beside the demo")
    parser.add_argument("--json", type=Path, default=REPO / ".tally" / "demo-under-load.json")
    options = parser.parse_args()

    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(options.hogs)
    ]
    runs = []
    try:
        for number in range(1, options.runs + 1):
            run = _run(number)
            runs.append(run)
            print(
                f"run {number:>2}: {'pass' if run.passed else 'FAIL'} "
                f"in {run.seconds:.0f} s (load {run.load:.1f})",
                flush=True,
            )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()

    passed = sum(run.passed for run in runs)
    seconds = sorted(run.seconds for run in runs)
    print(
        f"\n{passed}/{len(runs)} demo runs passed beside {options.hogs} CPU hogs "
        f"on {os.cpu_count()} CPUs; median {seconds[len(seconds) // 2]:.0f} s, "
        f"slowest {seconds[-1]:.0f} s"
    )
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(
        json.dumps(
            {
                "runs": [asdict(run) | {"passed": run.passed} for run in runs],
                "passed": passed,
                "hogs": options.hogs,
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"results: {options.json}")
    return 0 if passed == len(runs) else 1


def _run(number: int) -> Run:
    with tempfile.TemporaryDirectory(prefix="tally-demo-") as state:
        environment = os.environ | {"TALLY_STATE_DIR": state}
        started = time.monotonic()
        try:
            result = subprocess.run(
                [sys.executable, "-m", "tally.cli", "demo"],
                cwd=REPO,
                env=environment,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
            )
            code, tail = result.returncode, (result.stdout + result.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            code, tail = None, f"no result after {RUN_TIMEOUT} s"
            # The demo's stack runs in sessions of its own: stop it, or it outlives the run.
            subprocess.run([sys.executable, "-m", "tally.cli", "local", "down"], env=environment)
        seconds = round(time.monotonic() - started, 1)
        return Run(number, code, seconds, os.getloadavg()[0], "" if code == 0 else tail)


if __name__ == "__main__":
    sys.exit(main())
