"""docs/adopting.md runs as written: each walk-through's `$ ` commands, in order, in a new
user's shell in the checkout, each exiting 0 and printing the lines the page shows under it
("..." stands for lines left out); its bash and Python blocks too, unless an HTML comment
right above one says why not
(``<!-- not run by tests/integration/test_adopting_doc.py: <reason> -->``).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.integration.test_global_adopting_doc import HEADING as GLOBAL_TABLE
from tests.integration.test_readme import ROOT, Block, blocks
from tests.integration.walkthrough import RUNNABLE, commands, run_page, user_env, without_section

DOC = ROOT / "docs" / "adopting.md"
NOT_RUN = re.compile(r"<!-- not run by tests/integration/test_adopting_doc\.py: (.+?) -->\s*$")


def page() -> list[Block]:
    """The page but its Global Table walk-through: test_global_adopting_doc.py runs that."""
    return list(blocks(without_section(DOC.read_text(), GLOBAL_TABLE), NOT_RUN))


def test_every_block_runs_or_says_why_not() -> None:
    walks = [b for b in page() if b.language == "console" and commands(b)]
    assert len(walks) >= 6, "found too few walk-through blocks: the parsing is broken"
    for block in page():
        if block.language in RUNNABLE:
            assert block.skipped_because is None or block.skipped_because.strip(), block.line
    # Every walk-through starts its stack, loads its example and stops it again.
    ups = [c.text for b in walks for c in commands(b) if c.text.startswith("tally local up")]
    loads = [c.text for b in walks for c in commands(b) if c.text.startswith("tally examples")]
    downs = [c.text for b in walks for c in commands(b) if c.text == "tally local down"]
    assert len(ups) == len(downs) == 4 and len(loads) == 7, (ups, loads, downs)


def test_the_walk_throughs_run_as_written(tmp_path: Path) -> None:
    ran = run_page("docs/adopting.md", page(), user_env(tmp_path / "state"))
    assert ran >= 6
