"""The audit state machine's definition (Amazon States Language) in template.yaml.

Checked here: every state is reachable from StartAt (the Distributed Map's own states from
theirs), every Next/Default/Catch target exists, every state that does not end names what
comes next, every ``DefinitionSubstitutions`` key is used and every ``${...}`` is defined,
Task resources are well-formed Step Functions integration ARNs, and ``.$`` fields and
``*Path`` fields are paths. Then the definition, substituted as CloudFormation would, is
handed to the `asl-validator` npm package (`make asl` installs it into .cache/npm); without
it those tests are skipped, unless TALLY_REQUIRE_ASL_VALIDATOR is set (as `make test` does).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tally.local.template import load_template, template_path

VALIDATOR = Path(__file__).resolve().parents[3] / ".cache/npm/node_modules/.bin/asl-validator"
PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")
INTEGRATION = re.compile(
    r"^arn:aws:states:::[a-z0-9-]+(:[A-Za-z0-9]+)+(\.sync|\.waitForTaskToken)?$"
)
TERMINAL = {"Succeed", "Fail"}


def state_machine(template: Mapping[str, Any] | None = None) -> dict[str, Any]:
    template = template or load_template(template_path())
    [body] = [
        r for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::StateMachine"
    ]
    return dict(body["Properties"])


def problems(props: Mapping[str, Any]) -> list[str]:
    """Everything wrong with the definition and its substitutions, in words."""
    definition, substitutions = props["Definition"], props.get("DefinitionSubstitutions", {})
    found = list(_graph_problems(definition, "top level"))
    used = set(PLACEHOLDER.findall(json.dumps(definition)))
    found += [
        f"${{{key}}} is used but not in DefinitionSubstitutions"
        for key in sorted(used - set(substitutions))
    ]
    found += [
        f"DefinitionSubstitutions {key} is never used" for key in sorted(set(substitutions) - used)
    ]
    for where, state in _states(definition):
        found += [f"{where}: {p}" for p in _state_problems(state)]
    return found


def _graph_problems(machine: Mapping[str, Any], where: str) -> Iterator[str]:
    states = machine["States"]
    if machine.get("StartAt") not in states:
        yield f"{where}: StartAt {machine.get('StartAt')!r} is not a state"
    for name, state in states.items():
        for target in _targets(state):
            if target not in states:
                yield f"{where}: {name} goes to {target!r}, which is not a state"
        kind = state["Type"]
        if (
            kind not in TERMINAL
            and kind != "Choice"
            and not state.get("End")
            and "Next" not in state
        ):
            yield f"{where}: {name} has neither Next nor End"
        if state.get("End") and "Next" in state:
            yield f"{where}: {name} has both Next and End"
        if kind == "Choice" and not state.get("Choices"):
            yield f"{where}: {name} has no Choices"
        inner = (state.get("ItemProcessor") or state.get("Iterator")) if kind == "Map" else None
        if inner is not None:
            yield from _graph_problems(inner, f"{name}'s processor")
        for branch in state.get("Branches", []) if kind == "Parallel" else []:
            yield from _graph_problems(branch, f"{name}'s branch")
    reached, todo = set(), [machine.get("StartAt")]
    while todo:
        name = todo.pop()
        if name in reached or name not in states:
            continue
        reached.add(name)
        todo += _targets(states[name])
    for name in sorted(set(states) - reached):
        yield f"{where}: {name} is unreachable from {machine.get('StartAt')}"


def _targets(state: Mapping[str, Any]) -> list[str]:
    targets = [state["Next"]] if "Next" in state else []
    targets += [choice["Next"] for choice in state.get("Choices", [])]
    targets += [state["Default"]] if "Default" in state else []
    targets += [catch["Next"] for catch in state.get("Catch", [])]
    return targets


def _states(machine: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for name, state in machine["States"].items():
        yield prefix + name, state
        inner = state.get("ItemProcessor") or state.get("Iterator")
        if inner is not None:
            yield from _states(inner, f"{prefix}{name}.")


def _state_problems(state: Mapping[str, Any]) -> Iterator[str]:
    resources = [state.get("Resource")]
    resources += [state.get(part, {}).get("Resource") for part in ("ItemReader", "ResultWriter")]
    for resource in filter(None, resources):
        if not INTEGRATION.match(resource):
            yield f"Resource {resource!r} is not a Step Functions integration ARN"
    for field in ("InputPath", "OutputPath", "ResultPath"):
        if field in state and state[field] is not None and not str(state[field]).startswith("$"):
            yield f"{field} {state[field]!r} is not a path"
    for field in ("Variable",):
        for choice in state.get("Choices", []):
            if not str(choice.get(field, "$")).startswith("$"):
                yield f"Choice {field} {choice[field]!r} is not a path"
    yield from _payload_problems(state, "")


def _payload_problems(node: Any, where: str) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("ItemProcessor", "Iterator"):
                continue  # its states are checked on their own
            if key.endswith(".$") and not (
                isinstance(value, str) and (value.startswith("$") or value.startswith("States."))
            ):
                yield f"{where}{key}: {value!r} is neither a path nor an intrinsic function"
            path = key.endswith("Path") and key not in ("ResultPath", "InputPath", "OutputPath")
            if path and isinstance(value, str) and not value.startswith("$"):
                yield f"{where}{key}: {value!r} is not a path"
            yield from _payload_problems(value, f"{where}{key}.")
    elif isinstance(node, list):
        for item in node:
            yield from _payload_problems(item, where)


def substituted(props: Mapping[str, Any]) -> dict[str, Any]:
    """The definition as CloudFormation hands it to Step Functions: placeholders filled in."""
    values = {
        "TableName": "Social",
        "TableArn": "arn:aws:dynamodb:us-east-1:123456789012:table/Social",
        "Bucket": "tally-audit-bucket",
        "WorkGroup": "tally-audit",
        "AuditFunction": "arn:aws:lambda:us-east-1:123456789012:function:tally-audit",
        "AuditQueryFunction": "arn:aws:lambda:us-east-1:123456789012:function:tally-query",
        "AuditCandidatesFunction": "arn:aws:lambda:us-east-1:123456789012:function:tally-cand",
    }
    text = PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), json.dumps(props["Definition"]))
    definition: dict[str, Any] = json.loads(text)
    return definition


def test_the_audit_state_machine_is_well_formed() -> None:
    assert problems(state_machine()) == []


@pytest.mark.parametrize(
    ("plant", "expected"),
    [
        (lambda p: p["DefinitionSubstitutions"].pop("WorkGroup"), "${WorkGroup} is used but"),
        (lambda p: p["DefinitionSubstitutions"].update(Spare="x"), "Spare is never used"),
        (lambda p: p["Definition"]["States"]["Query"].pop("Next"), "Query has neither Next"),
        (
            lambda p: p["Definition"]["States"]["ExportDone"].pop("Default"),
            "ExportFailed is unreachable",
        ),
        (
            lambda p: p["Definition"]["States"]["Scan"].update(Resource="arn:aws:lambda:invoke"),
            "not a Step Functions integration ARN",
        ),
        (
            lambda p: p["Definition"]["States"]["PlanQuery"]["ResultSelector"].update(
                {"create.$": "Payload.create"}
            ),
            "create.$: 'Payload.create' is neither a path",
        ),
        (
            lambda p: p["Definition"]["States"]["Candidates"]["ItemProcessor"]["States"][
                "Check"
            ].update(Next="Nowhere"),
            "Check goes to 'Nowhere'",
        ),
    ],
)
def test_each_planted_defect_is_named(plant: Any, expected: str) -> None:
    props = copy.deepcopy(state_machine())
    plant(props)
    assert any(expected in p for p in problems(props)), problems(props)


def _validate(definition: Mapping[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "definition.json"
    path.write_text(json.dumps(definition))
    return subprocess.run(
        [str(VALIDATOR), "--json-path", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def validator() -> Path:
    if not VALIDATOR.exists():
        if os.environ.get("TALLY_REQUIRE_ASL_VALIDATOR"):
            pytest.fail(f"asl-validator is not installed at {VALIDATOR}: run `make asl`")
        pytest.skip("asl-validator is not installed: `make asl` installs it")
    return VALIDATOR


def test_asl_validator_accepts_the_substituted_definition(validator: Path, tmp_path: Path) -> None:
    result = _validate(substituted(state_machine()), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("plant", "expected"),
    [
        (lambda d: d["States"]["Query"].update(Next="Nowhere"), "Missing 'StartAt'|'Next'"),
        (lambda d: d["States"]["ExportDone"].pop("Default"), "ExportFailed is not reachable"),
        (lambda d: d["States"]["Scan"].update(Resource="arn:aws:lambda:invoke"), "Resource"),
        (
            lambda d: d["States"]["PlanQuery"]["ResultSelector"].update(
                {"create.$": "Payload.create"}
            ),
            "asl_payload_template",
        ),
    ],
)
def test_asl_validator_refuses_a_planted_defect(
    plant: Any, expected: str, validator: Path, tmp_path: Path
) -> None:
    definition = substituted(state_machine())
    plant(definition)
    result = _validate(definition, tmp_path)
    assert result.returncode != 0 and expected in result.stdout + result.stderr, result.stdout
