"""A candidate row whose ``actual`` is NULL, as Athena's CSV writes it (an empty field).

The users example's export audit gives one: its members-only sequence counts no member for
a parent, so ``actual`` is NULL. AuditCandidatesFunction must take the row, not fail the
Distributed Map over it.
"""

from __future__ import annotations

from pathlib import Path

from tally.audit.candidates import parse_candidate
from tally.rules import load_rules

RULES = load_rules(Path(__file__).resolve().parents[3] / "src" / "rules.toml")


def test_an_empty_actual_is_null_like_every_other_empty_field() -> None:
    row = {"rule": "likes", "key_0": "POST#1", "key_1": "META", "stored": "3", "actual": ""}
    candidate = parse_candidate(row | {"drift": "1", "first_missing": ""}, RULES)
    assert (candidate.stored, candidate.actual) == ("3", None)
