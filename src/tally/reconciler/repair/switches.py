"""The repair switches: the kill switch, dry run and the per-invocation repair budget, as one
value an operator flips at run time (an SSM parameter, docs/operations.md) and every function
reads; without a parameter, the function's environment. Switches that cannot be read fail
safe: no repairs, alerts continue."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

State = Literal["on", "off", "dry_run"]
STATES: tuple[State, ...] = ("on", "off", "dry_run")
# The largest budget a parameter may hold (a budget caps what a systemic bug can rewrite).
MAX_BUDGET = 1_000_000


class SwitchesError(ValueError):
    """The switches' value is not what the functions read; the message names the field."""


class _Values(BaseModel):
    """The parameter's JSON: every field present, no other, each of its own type (a typo such
    as ``repair_enabled`` is refused, not read as repairs left on)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    repairs_enabled: bool
    dry_run: bool
    repair_budget: int = Field(ge=0, le=MAX_BUDGET)


@dataclass(frozen=True)
class Switches:
    """What the switches say, and where they were read (``source``); ``unreadable`` says why
    they could not be (then nothing is repaired)."""

    enabled: bool
    dry_run: bool
    budget: int
    source: str
    unreadable: str = ""

    @classmethod
    def failing_safe(cls, source: str, why: str) -> Switches:
        """Switches that could not be read: no repairs; alerts continue."""
        return cls(False, False, 0, source, unreadable=why)

    @property
    def state(self) -> State:
        if not self.enabled:
            return "off"
        return "dry_run" if self.dry_run else "on"

    def describe(self) -> str:
        """One line for an operator: the state, the budget and where it was read."""
        if self.unreadable:
            return f"repairs off: {self.source} cannot be read ({self.unreadable})"
        return f"repairs {self.state.replace('_', ' ')}, budget {self.budget} ({self.source})"

    def as_json(self) -> dict[str, Any]:
        """As every alert shows them (docs/alerts.md)."""
        shown: dict[str, Any] = {"repairs": self.state, "budget": self.budget, "from": self.source}
        if self.unreadable:
            shown["unreadable"] = self.unreadable
        return shown

    def value(self) -> str:
        """The parameter's value for these switches (what ``parse_switches`` reads back)."""
        return json.dumps(
            {"repairs_enabled": self.enabled, "dry_run": self.dry_run, "repair_budget": self.budget}
        )

    def switched(self, state: State | None = None, budget: int | None = None) -> Switches:
        """These switches with ``state`` and ``budget`` set (each kept when None); checked as
        the functions will read them (SwitchesError naming the field)."""
        enabled, dry_run = (self.enabled, self.dry_run) if state is None else _flags(state)
        kept = Switches(enabled, dry_run, self.budget if budget is None else budget, self.source)
        return parse_switches(kept.value(), self.source)


def _flags(state: State) -> tuple[bool, bool]:
    return {"on": (True, False), "off": (False, False), "dry_run": (True, True)}[state]


def parse_switches(text: Any, source: str) -> Switches:
    """The switches ``text`` (the parameter's JSON) holds; SwitchesError naming the field."""
    if not isinstance(text, str):
        raise SwitchesError(f"the value is {type(text).__name__}, not JSON text")
    try:
        raw = json.loads(text)
    except ValueError as error:
        raise SwitchesError(f"the value is not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise SwitchesError(f"the value is a JSON {type(raw).__name__}, not an object")
    try:
        values = _Values.model_validate(raw)
    except ValidationError as error:
        # pydantic repeats the input; the field and the problem are enough.
        raise SwitchesError(
            "; ".join(
                f"{'.'.join(str(p) for p in d['loc']) or 'value'}: {d['msg']}"
                for d in error.errors()
            )
        ) from None
    return Switches(values.repairs_enabled, values.dry_run, values.repair_budget, source)
