"""The repair switches: what a parameter's value makes of them, and that anything else, or a
parameter that cannot be read, repairs nothing."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws

from tally.reconciler.repair.policy import RepairPolicy
from tally.reconciler.repair.switch_parameter import SwitchParameter
from tally.reconciler.repair.switches import (
    MAX_BUDGET,
    STATES,
    Switches,
    SwitchesError,
    parse_switches,
)
from tally.rules import load_rules
from tests.unit.writers.test_writer_items import RULES_FILE

FIELDS = ("repairs_enabled", "dry_run", "repair_budget")
RULE = load_rules(RULES_FILE)["likes"]
states = st.sampled_from(STATES)
budgets = st.integers(0, MAX_BUDGET)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(states, budgets, states, st.none() | budgets)
def test_switches_written_read_back_as_they_were_switched(
    first: Any, budget: int, state: Any, new_budget: int | None
) -> None:
    start = Switches(True, False, budget, "parameter p").switched(first)
    switched = start.switched(state, new_budget)
    assert switched.state == state
    assert switched.budget == (budget if new_budget is None else new_budget)
    assert parse_switches(switched.value(), "parameter p") == switched


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from([*FIELDS, "repair_enabled", "dryRun"]), json_values))
def test_a_value_is_read_only_when_it_holds_exactly_the_three_fields_each_of_its_type(
    value: dict[str, Any],
) -> None:
    """A typo, a missing field, a string "false" or a budget of 2.5 is refused, never read as
    repairs left on; the refusal names the field."""
    valid = (
        set(value) == set(FIELDS)
        and isinstance(value["repairs_enabled"], bool)
        and isinstance(value["dry_run"], bool)
        and type(value["repair_budget"]) is int
        and 0 <= value["repair_budget"] <= MAX_BUDGET
    )
    text = json.dumps(value)
    if valid:
        read = parse_switches(text, "parameter p")
        assert (read.enabled, read.dry_run, read.budget) == tuple(value[f] for f in FIELDS)
        return
    with pytest.raises(SwitchesError) as refused:
        parse_switches(text, "parameter p")
    wrong = [f for f in value if f not in FIELDS] or [f for f in FIELDS if f in str(refused.value)]
    assert wrong and any(name in str(refused.value) for name in wrong)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | json_values.map(json.dumps))
def test_any_text_is_switches_or_an_error_never_a_crash(text: str) -> None:
    try:
        read = parse_switches(text, "parameter p")
    except SwitchesError:
        return
    assert set(json.loads(text)) == set(FIELDS) and read.source == "parameter p"


@settings(max_examples=200, deadline=None)
@given(states, budgets, st.integers(0, 5))
def test_the_policy_does_what_the_switches_say(state: Any, budget: int, used: int) -> None:
    switches = Switches(True, False, budget, "parameter p").switched(state)
    policy = RepairPolicy.of(switches)
    policy.used = used
    verdict = policy.verdict(RULE, 1, 2)
    if state == "off":
        assert verdict is not None and verdict.status == "disabled"
        assert "parameter p" in verdict.reason
    elif state == "dry_run":
        assert verdict is not None and verdict.status == "dry_run"
        assert "parameter p" in verdict.reason
    elif used >= budget:
        assert verdict is not None and verdict.status == "skipped"
    else:
        assert verdict is None and policy.used == used + 1


def test_switches_that_cannot_be_read_repair_nothing_and_say_why() -> None:
    switches = Switches.failing_safe("parameter p", "AccessDenied")
    verdict = RepairPolicy.of(switches).verdict(RULE, 1, 2)
    assert verdict is not None and verdict.status == "disabled"
    assert "parameter p cannot be read: AccessDenied" in verdict.reason
    assert switches.as_json() == {
        "repairs": "off",
        "budget": 0,
        "from": "parameter p",
        "unreadable": "AccessDenied",
    }


def test_an_operators_dry_run_is_not_said_to_come_from_the_switches() -> None:
    on = Switches(True, False, 25, "parameter p")
    verdict = RepairPolicy(dry_run=True, switches=on).verdict(RULE, 1, 2)
    assert verdict is not None and "parameter p" not in verdict.reason


@mock_aws
def test_the_parameter_is_read_once_per_max_age_and_fails_safe_when_gone() -> None:
    ssm = boto3.client("ssm", region_name="us-east-1")
    name = "/tally/test/repair-switches"
    ssm.put_parameter(Name=name, Type="String", Value=Switches(True, False, 7, "").value())
    cached = SwitchParameter(name, ssm, max_age=3600)
    fresh = SwitchParameter(name, ssm, max_age=0)
    assert cached.read() == fresh.read() == Switches(True, False, 7, f"parameter {name}")
    off = Switches(False, False, 7, "").value()
    ssm.put_parameter(Name=name, Type="String", Value=off, Overwrite=True)
    assert cached.read().state == "on"  # kept for its max_age
    assert fresh.read().state == "off"
    ssm.put_parameter(Name=name, Type="String", Value='{"repairs_enabled": "yes"}', Overwrite=True)
    garbled = fresh.read()
    assert garbled.state == "off" and "repairs_enabled" in garbled.unreadable
    ssm.delete_parameter(Name=name)
    gone = fresh.read()
    assert gone.state == "off" and gone.budget == 0 and gone.unreadable
