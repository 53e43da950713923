"""The README and the docs state what the code does (issue 21): the idempotency window, and
package sizes stated once (docs/operations.md, checked against the build there)."""

from __future__ import annotations

import re
from pathlib import Path

from tally.writers.idempotency import WINDOW_SECONDS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_idempotency_window_is_a_day_wherever_it_is_stated() -> None:
    assert WINDOW_SECONDS == 24 * 3600
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(r"same key|idempotency key|Idempotency-Key", line, re.IGNORECASE):
                assert not re.search(r"\d+ minutes|\d+ hours", line), f"{page.name}:{number}"


def test_package_sizes_are_stated_in_one_place() -> None:
    sizes = re.compile(r"\d+(\.\d+)? MB (each|zipped)|about \d+(\.\d+)? MB")
    stated = [p.name for p in PAGES if sizes.search(p.read_text())]
    assert stated == ["operations.md"], stated
