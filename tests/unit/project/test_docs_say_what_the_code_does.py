"""The README and the docs state what the code does (issue 21): the idempotency window, and
package sizes stated once (docs/operations.md, checked against the build there)."""

from __future__ import annotations

import re
from pathlib import Path

from tally.writers.idempotency import WINDOW_SECONDS

ROOT = Path(__file__).resolve().parents[3]
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


def test_the_verification_spec_has_one_section_per_core_module_in_its_order() -> None:
    """docs/verification.md's map: every module of the pure core, once, in the order of the
    sections it names; and every I/O module it names exists."""
    import tally.reconciler.protocol as protocol

    text = (ROOT / "docs/verification.md").read_text()
    rows = re.findall(
        r"^\| \[[^\]]+\]\(#([a-z0-9-]+)\) \| `(\w+\.py)` \| `([\w/]+\.py)` \|$", text, re.M
    )
    core = sorted(
        p.name for p in Path(protocol.__file__).parent.glob("*.py") if p.name != "__init__.py"
    )
    assert sorted(module for _, module, _ in rows) == core
    assert len({module for _, module, _ in rows}) == len(rows)
    headings = [
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#{2,3} (.+)$", text, re.M)
    ]
    anchors = [anchor for anchor, _, _ in rows]
    assert all(a in headings for a in anchors), set(anchors) - set(headings)
    assert [headings.index(a) for a in anchors] == sorted(headings.index(a) for a in anchors)
    reconciler = Path(protocol.__file__).parent.parent
    assert all((reconciler / io).exists() for _, _, io in rows)
    # The package's own docstring names them in the same order.
    named = re.findall(r"``(\w+)``", protocol.__doc__ or "")
    assert [f"{n}.py" for n in named] == [module for _, module, _ in rows]
