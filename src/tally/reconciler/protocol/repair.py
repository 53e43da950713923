"""Step 3, repair: whether a finding may be repaired at all, and what stands instead of a
write the operator's settings refuse."""

from __future__ import annotations

from typing import Any, Literal

from tally.reconciler.protocol.judgement import Kind, valid_revision
from tally.rules import SequenceRule, TallyRule

Refused = Literal["skipped", "disabled", "dry_run"]


def never_repaired(
    rule: TallyRule | SequenceRule, kind: Kind, attribute: str, revision: Any
) -> str:
    """Why a finding is never repaired automatically ("" when it may be)."""
    if kind == "invalid_counter":
        return "the counter holds no number: a repair writes only over a number it judged"
    if kind == "unrepresentable":
        return "no counter can hold the children's sum: a human decides"
    if attribute != rule.counter or (rule.revision and not valid_revision(revision)):
        return f"the revision attribute {rule.revision!r} is not a number: a human decides"
    return ""


def refusal(
    rule_name: str,
    mode: str,
    *,
    enabled: bool,
    dry_run: bool,
    budget: int,
    used: int,
    switched_by: str = "",
) -> tuple[Refused, str] | None:
    """Why the settings refuse a repair the protocol would write, as (status, reason); None
    when it may be written. In this order: the rule's mode, the kill switch, dry run, and
    the invocation's budget (``used`` of ``budget`` repairs written so far). ``switched_by``
    says where the switches were read (a parameter, or why it could not be read)."""
    if mode != "auto":
        return "skipped", f"rule {rule_name!r} repair mode is {mode!r}"
    if not enabled:
        return "disabled", f"repairs are switched off ({switched_by or 'REPAIRS_ENABLED=false'})"
    if dry_run:
        return "dry_run", f"dry run ({switched_by or 'DRY_RUN=true'}): nothing written"
    if used >= budget:
        return "skipped", f"repair budget of {budget} per invocation used up"
    return None
