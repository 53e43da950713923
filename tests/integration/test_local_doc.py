"""docs/local.md runs as written: its `$ ` commands in order, in a new user's shell in the
checkout, each exiting 0 and printing the lines the page shows under it ("..." stands for
lines left out, or for the part of a line that changes from run to run, such as a time); its
bash and Python blocks too, unless an HTML comment right above one says why not
(``<!-- not run by tests/integration/test_local_doc.py: <reason> -->``).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.integration.test_readme import ROOT, Block, blocks
from tests.integration.walkthrough import RUNNABLE, commands, run_page, shown_in, user_env

DOC = ROOT / "docs" / "local.md"
NOT_RUN = re.compile(r"<!-- not run by tests/integration/test_local_doc\.py: (.+?) -->\s*$")


def page() -> list[Block]:
    return list(blocks(DOC.read_text(), NOT_RUN))


def test_every_block_runs_or_says_why_not() -> None:
    walks = [b for b in page() if b.language == "console" and commands(b)]
    assert walks, "found no walk-through block: the parsing is broken"
    for block in page():
        if block.language in RUNNABLE:
            assert block.skipped_because is None or block.skipped_because.strip(), block.line


def test_a_shown_line_matches_with_its_elisions() -> None:
    assert shown_in("due ... UTC (in 30 s)", "x due 09:00:01 UTC (in 30 s) y")
    assert not shown_in("due ... UTC (in 30 s)", "due 09:00:01 UTC (in 29 s)")


def test_docs_local_runs_as_written(tmp_path: Path) -> None:
    env = user_env(tmp_path / "state")
    env["DOCKER"] = "false"  # `make invoke` in process (Docker would pull)
    assert run_page("docs/local.md", page(), env) >= 3
