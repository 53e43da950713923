"""template.yaml on an existing table: SAM's own translator, with and without the parameters.

The translated CloudFormation is resolved the way CloudFormation would (conditions, ``Fn::If``,
parameters in ``Fn::Sub``) so the tests see what each deployment creates and what it grants.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator

from tally.local.functions import parameter_defaults
from tally.local.template import conditions, load_template, template_path

EXISTING = {
    "ExistingTableName": "Social",
    "ExistingTableStreamArn": (
        "arn:aws:dynamodb:us-east-1:123456789012:table/Social/stream/2024-06-01T00:00:00.000"
    ),
}
TABLE_ARN = "arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/Social"
# Item-level actions: what a statement on the counted table grants.
ITEM_ACTIONS = re.compile(r"dynamodb:(GetItem|Query|PutItem|UpdateItem|DeleteItem|Scan|Condition)")


def deployed(parameters: Mapping[str, str]) -> dict[str, Any]:
    """What CloudFormation would create from the translated template with these parameters."""
    template = load_template(template_path())
    template["Globals"]["Function"]["CodeUri"] = "s3://bucket/code.zip"  # as `sam package` does
    for body in template["Resources"].values():
        if body["Type"] == "AWS::Serverless::LayerVersion":
            body["Properties"]["ContentUri"] = "s3://bucket/layer.zip"
    translated = Translator(None, Parser()).translate(
        copy.deepcopy(template), parameter_values=dict(parameters), get_managed_policy_map=dict
    )
    values = parameter_defaults(translated) | dict(parameters)
    chosen = conditions(translated, values | {"AWS::Region": "us-east-1"})
    resources = {
        name: resolve(body, values, chosen)
        for name, body in translated["Resources"].items()
        if chosen.get(body.get("Condition", ""), True)
    }
    outputs = {
        name: resolve(o["Value"], values, chosen) for name, o in translated["Outputs"].items()
    }
    return {"Resources": resources, "Outputs": outputs, "Rules": translated.get("Rules", {})}


def resolve(node: Any, values: Mapping[str, str], chosen: Mapping[str, bool]) -> Any:
    if isinstance(node, list):
        return [resolve(item, values, chosen) for item in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {"Fn::If"}:
        condition, yes, no = node["Fn::If"]
        return resolve(yes if chosen[condition] else no, values, chosen)
    if set(node) == {"Ref"} and node["Ref"] in values:
        return values[node["Ref"]]
    if set(node) == {"Fn::Sub"} and isinstance(node["Fn::Sub"], str):
        text = re.sub(r"\$\{(\w+)\}", lambda m: values.get(m[1], m[0]), node["Fn::Sub"])
        return {"Fn::Sub": text}
    return {key: resolve(value, values, chosen) for key, value in node.items()}


def mentions_table(node: Any) -> bool:
    """Whether anything refers to the example table's logical id."""
    if isinstance(node, list):
        return any(mentions_table(item) for item in node)
    if isinstance(node, dict):
        if node.get("Ref") == "Table" or node.get("Fn::GetAtt", [None])[0] == "Table":
            return True
        sub = node.get("Fn::Sub")
        if isinstance(sub, str) and re.search(r"\$\{Table[.}]", sub):
            return True
        return any(mentions_table(value) for value in node.values())
    return False


def statements(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if isinstance(node.get("Statement"), list):
            yield from node["Statement"]
        for value in node.values():
            yield from statements(value)
    elif isinstance(node, list):
        for value in node:
            yield from statements(value)


def counted_table_statements(stack: dict[str, Any]) -> list[dict[str, Any]]:
    """Statements granting item access on the counted table (not the audit table)."""
    found = []
    for statement in statements(stack["Resources"]):
        actions = statement.get("Action", [])
        actions = actions if isinstance(actions, list) else [actions]
        resources = statement.get("Resource", [])
        resources = resources if isinstance(resources, list) else [resources]
        if (
            any(ITEM_ACTIONS.match(a) for a in actions)
            and {"Fn::GetAtt": ["AuditTable", "Arn"]} not in resources
        ):
            found.append(statement | {"Resource": resources})
    return found


def by_type(stack: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in stack["Resources"].items() if r["Type"] == kind}


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    return deployed({})


@pytest.fixture(scope="module")
def existing() -> dict[str, Any]:
    return deployed(EXISTING)


def test_by_default_the_stack_creates_and_reconciles_the_example_table(
    example: dict[str, Any],
) -> None:
    assert set(by_type(example, "AWS::DynamoDB::Table")) == {"Table", "AuditTable"}
    [mapping] = [
        m
        for m in by_type(example, "AWS::Lambda::EventSourceMapping").values()
        if "StartingPosition" in m["Properties"]
    ]
    assert mapping["Properties"]["EventSourceArn"] == {"Fn::GetAtt": ["Table", "StreamArn"]}
    for function in by_type(example, "AWS::Lambda::Function").values():
        assert function["Properties"]["Environment"]["Variables"]["TABLE_NAME"] == {"Ref": "Table"}
    assert example["Outputs"]["TableName"] == {"Ref": "Table"}
    grants = counted_table_statements(example)
    assert grants and all(mentions_table(s["Resource"]) for s in grants)
    assert "Social" not in repr(example)


def test_an_existing_table_gets_no_table_of_ours(existing: dict[str, Any]) -> None:
    assert set(by_type(existing, "AWS::DynamoDB::Table")) == {"AuditTable"}
    assert not mentions_table(existing["Resources"]) and not mentions_table(existing["Outputs"])


def test_every_function_and_output_names_the_existing_table(existing: dict[str, Any]) -> None:
    functions = by_type(existing, "AWS::Lambda::Function")
    assert len(functions) == 6  # reconciler, recheck, audit, writer, audit query, candidates
    for function in functions.values():
        assert function["Properties"]["Environment"]["Variables"]["TABLE_NAME"] == "Social"
    assert existing["Outputs"]["TableName"] == "Social"
    assert existing["Outputs"]["TableStreamArn"] == EXISTING["ExistingTableStreamArn"]


def test_the_stream_mapping_reads_the_existing_tables_stream(existing: dict[str, Any]) -> None:
    [mapping] = [
        m
        for m in by_type(existing, "AWS::Lambda::EventSourceMapping").values()
        if "StartingPosition" in m["Properties"]
    ]
    properties = mapping["Properties"]
    assert properties["EventSourceArn"] == EXISTING["ExistingTableStreamArn"]
    default = load_template(template_path())["Parameters"]["StreamFilterPattern"]["Default"]
    assert properties["FilterCriteria"] == {"Filters": [{"Pattern": default}]}


def test_grants_are_scoped_to_the_existing_table_and_its_indexes(existing: dict[str, Any]) -> None:
    grants = counted_table_statements(existing)
    assert len(grants) >= 3  # verify-and-repair, the audit's scan, the writers
    allowed = {TABLE_ARN, TABLE_ARN + "/index/*"}
    for statement in grants:
        resources = {r["Fn::Sub"] if isinstance(r, dict) else r for r in statement["Resource"]}
        assert resources <= allowed, statement
        # An index is only queried (the index layout's recount), never read or written.
        assert TABLE_ARN in resources or statement["Action"] == "dynamodb:Query", statement


def test_a_table_name_without_its_stream_is_refused_at_deploy(existing: dict[str, Any]) -> None:
    rule = existing["Rules"]["ExistingTableNeedsItsStream"]
    assert rule["Assertions"][0]["Assert"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "ExistingTableStreamArn"}, ""]}]
    }
