"""Create local tables from a template (template.yaml, or the user's own, so local and deployed
tables cannot disagree) or from a rules file's key schema."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tally.rules import IndexMembers, RuleSet, SequenceRule, SumRule, TableKeys, TallyRule
from tally.rules.live_table import STREAM_VIEW

TEMPLATE_FILE = "template.yaml"


class TemplateNotFoundError(FileNotFoundError):
    """No template where the project should be; the message says where tally looked."""

    def __str__(self) -> str:
        return str(self.args[0])


def template_path() -> Path:
    """The project's template: ``$TALLY_TEMPLATE``, else template.yaml in the working directory.

    Never one next to the installed package: an installed tally serves the project it runs in.
    """
    configured = os.environ.get("TALLY_TEMPLATE")
    path = Path(configured or TEMPLATE_FILE).absolute()
    if configured and not path.is_file():
        raise TemplateNotFoundError(f"TALLY_TEMPLATE={configured}: no such file")
    if not path.is_file():
        raise TemplateNotFoundError(
            f"no {TEMPLATE_FILE} in {path.parent}: run tally in the project's directory "
            "(where template.yaml is) or pass --template PATH"
        )
    return path


class TemplateResourceError(KeyError):
    """A logical id is missing from the template or is not the expected resource type."""

    def __str__(self) -> str:
        # KeyError would repr() the message; show it as written.
        return str(self.args[0])


# libyaml's parser where installed: every command reads the template, ten times faster.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _CloudFormationLoader(_SafeLoader):  # type: ignore[valid-type,misc]
    """SafeLoader that turns every short-form intrinsic tag into its long form."""


def _intrinsic(loader: yaml.SafeLoader, name: str, node: yaml.Node) -> dict[str, Any]:
    """``!Ref x`` -> ``{"Ref": "x"}``, ``!Name v`` -> ``{"Fn::Name": v}``: any tag, as
    cfn-lint reads them, so a function CloudFormation adds reads without a change here."""
    key = name if name in ("Ref", "Condition") else f"Fn::{name}"
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if name == "GetAtt":
            value = value.split(".", 1)  # !GetAtt Resource.Attribute.With.Dots
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode)
        value = loader.construct_mapping(node, deep=True)
    return {key: value}


_CloudFormationLoader.add_multi_constructor("!", _intrinsic)


class TemplateError(ValueError):
    """The template cannot be read as one; the message, one line, says which file and why."""


def load_template(path: Path) -> dict[str, Any]:
    """Read a CloudFormation/SAM YAML template, intrinsics in long form."""
    try:
        with path.open(encoding="utf-8") as f:
            # A SafeLoader subclass: no arbitrary object construction.
            template = yaml.load(f, Loader=_CloudFormationLoader)
    except yaml.YAMLError as error:
        raise TemplateError(f"template {path}: not valid YAML ({_yaml_problem(error)})") from None
    except UnicodeDecodeError as error:
        raise TemplateError(f"template {path}: not UTF-8 text (offset {error.start})") from None
    except RecursionError:
        raise TemplateError(f"template {path}: nested too deeply to read") from None
    except OSError as error:
        raise TemplateError(f"template {path}: {error.strerror or error}") from None
    if not isinstance(template, dict):
        raise TemplateError(f"template {path}: not a CloudFormation template")
    return template


def _yaml_problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def conditions(template: Mapping[str, Any], parameters: Mapping[str, str]) -> dict[str, bool]:
    """The template's Conditions, evaluated against the parameter values (a pseudo parameter,
    ``AWS::Region``, among them if a condition reads it)."""
    raw: Mapping[str, Any] = template.get("Conditions", {})
    lists = {
        name
        for name, spec in template.get("Parameters", {}).items()
        if spec.get("Type") == "CommaDelimitedList"
    }
    done: dict[str, bool] = {}

    def operand(node: Any) -> Any:
        if isinstance(node, Mapping) and set(node) == {"Ref"} and node["Ref"] in parameters:
            value = parameters[node["Ref"]]
            return value.split(",") if node["Ref"] in lists else value
        if isinstance(node, str | int | float | bool):
            return str(node)
        if isinstance(node, list):
            return [operand(item) for item in node]
        if isinstance(node, Mapping) and len(node) == 1:
            ((function, args),) = node.items()
            if function == "Fn::Join":
                return str(args[0]).join(operand(args[1]))
            if function == "Fn::Split":
                return str(operand(args[1])).split(str(args[0]))
            if function == "Fn::Select":
                return operand(args[1])[int(operand(args[0]))]
        raise ValueError(f"condition operand {node!r} cannot be evaluated locally")

    def evaluate(node: Any) -> bool:
        if isinstance(node, Mapping) and len(node) == 1:
            ((function, args),) = node.items()
            if function == "Condition":
                return named(args)
            if function == "Fn::Equals":
                return bool(operand(args[0]) == operand(args[1]))
            if function == "Fn::Not":
                return not evaluate(args[0])
            if function == "Fn::And":
                return all(evaluate(arg) for arg in args)
            if function == "Fn::Or":
                return any(evaluate(arg) for arg in args)
        raise ValueError(f"condition {node!r} cannot be evaluated locally")

    def named(name: str) -> bool:
        if name not in done:
            done[name] = evaluate(raw[name])
        return done[name]

    return {name: named(name) for name in raw}


def resource(template: Mapping[str, Any], logical_id: str, kind: str) -> dict[str, Any]:
    """The template's resource ``logical_id``; an error naming it if absent or not ``kind``."""
    found = template.get("Resources", {}).get(logical_id)
    if found is None:
        raise TemplateResourceError(f"template has no resource {logical_id!r}")
    if found.get("Type") != kind:
        raise TemplateResourceError(f"resource {logical_id!r} is {found.get('Type')!r}, not {kind}")
    body: dict[str, Any] = found
    return body


def _table_properties(template: dict[str, Any], logical_id: str) -> dict[str, Any]:
    properties: dict[str, Any] = resource(template, logical_id, "AWS::DynamoDB::Table").get(
        "Properties", {}
    )
    return properties


def _throughput(spec: dict[str, Any]) -> dict[str, int]:
    return {
        "ReadCapacityUnits": int(spec["ReadCapacityUnits"]),
        "WriteCapacityUnits": int(spec["WriteCapacityUnits"]),
    }


def create_table_kwargs(
    template: dict[str, Any], logical_id: str, table_name: str
) -> dict[str, Any]:
    """Return boto3 create_table kwargs for the template's AWS::DynamoDB::Table resource."""
    props = _table_properties(template, logical_id)
    # CloudFormation's default billing mode is PROVISIONED.
    provisioned = props.get("BillingMode", "PROVISIONED") == "PROVISIONED"
    kwargs: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": a["AttributeName"], "AttributeType": a["AttributeType"]}
            for a in props["AttributeDefinitions"]
        ],
        "KeySchema": [
            {"AttributeName": k["AttributeName"], "KeyType": k["KeyType"]}
            for k in props["KeySchema"]
        ],
        "BillingMode": "PROVISIONED" if provisioned else "PAY_PER_REQUEST",
    }
    if provisioned:
        kwargs["ProvisionedThroughput"] = _throughput(props["ProvisionedThroughput"])
    for key in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
        indexes = []
        for index in props.get(key, []):
            spec = {
                "IndexName": index["IndexName"],
                "KeySchema": index["KeySchema"],
                "Projection": index["Projection"],
            }
            if provisioned and key == "GlobalSecondaryIndexes":
                spec["ProvisionedThroughput"] = _throughput(index["ProvisionedThroughput"])
            indexes.append(spec)
        if indexes:
            kwargs[key] = indexes
    stream = props.get("StreamSpecification")
    if stream:
        kwargs["StreamSpecification"] = {
            "StreamEnabled": True,
            "StreamViewType": stream["StreamViewType"],
        }
    return kwargs


def time_to_live_attribute(template: dict[str, Any], logical_id: str) -> str | None:
    """Return the table's TTL attribute if the template enables TTL."""
    spec = _table_properties(template, logical_id).get("TimeToLiveSpecification")
    if spec and str(spec.get("Enabled")).lower() == "true":
        name: str = spec["AttributeName"]
        return name
    return None


def rules_table_kwargs(rules: RuleSet, table_name: str) -> dict[str, Any]:
    """create_table kwargs for the table the rules describe: its keys, the indexes its
    index-layout sequences and its ``through`` rules read, and the stream the reconciler
    needs."""
    keys = rules.table
    types: dict[str, str] = {name: keys.type_of(name) for name in keys.names}
    schema = [{"AttributeName": keys.partition_key, "KeyType": "HASH"}]
    if keys.sort_key is not None:
        schema.append({"AttributeName": keys.sort_key, "KeyType": "RANGE"})
    indexes: dict[str, dict[str, Any]] = {}
    for rule in rules:
        if isinstance(rule, SequenceRule) and isinstance(rule.members, IndexMembers):
            members = rule.members
            types |= {members.sequence_attribute: "S", members.number: "N"}
            indexes[members.index] = {
                "IndexName": members.index,
                "KeySchema": [
                    {"AttributeName": members.sequence_attribute, "KeyType": "HASH"},
                    {"AttributeName": members.number, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        elif isinstance(rule, TallyRule) and rule.through is not None:
            _through_index(rule, keys, types, indexes)
    kwargs: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": kind} for name, kind in types.items()
        ],
        "KeySchema": schema,
        "BillingMode": "PAY_PER_REQUEST",
        "StreamSpecification": {"StreamEnabled": True, "StreamViewType": STREAM_VIEW},
    }
    if indexes:
        kwargs["GlobalSecondaryIndexes"] = list(indexes.values())
    return kwargs


def _through_index(
    rule: TallyRule,
    keys: TableKeys,
    types: dict[str, str],
    indexes: dict[str, dict[str, Any]],
) -> None:
    """The GSI a ``through`` rule reads: its partition key holds the parent's partition key
    value (typed as the table's), its sort key (if named) a string; a count needs only the
    keys, a sum its ``summed`` attribute too. Rules sharing an index share its projection."""
    through = rule.through
    assert through is not None
    # An index key that is a table key keeps the table's type (an inverted index).
    types.setdefault(through.partition_key, keys.partition_key_type)
    schema = [{"AttributeName": through.partition_key, "KeyType": "HASH"}]
    if through.sort_key is not None:
        types.setdefault(through.sort_key, "S")
        schema.append({"AttributeName": through.sort_key, "KeyType": "RANGE"})
    index = indexes.setdefault(
        through.index,
        {
            "IndexName": through.index,
            "KeySchema": schema,
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        },
    )
    if isinstance(rule, SumRule) and rule.summed not in keys.names:
        projection = index["Projection"]
        included = [*projection.get("NonKeyAttributes", [])]
        if rule.summed not in included:
            included.append(rule.summed)
        index["Projection"] = {"ProjectionType": "INCLUDE", "NonKeyAttributes": included}


def create_table(
    client: Any, template: dict[str, Any], logical_id: str, table_name: str
) -> dict[str, Any]:
    """Create the table from the template, wait for ACTIVE, enable TTL; return its description."""
    kwargs = create_table_kwargs(template, logical_id, table_name)
    return create_table_from(client, kwargs, time_to_live_attribute(template, logical_id))


def create_table_from(
    client: Any, kwargs: dict[str, Any], ttl_attribute: str | None
) -> dict[str, Any]:
    """Create a table, wait for ACTIVE, enable TTL if named; return its description."""
    table_name = kwargs["TableName"]
    client.create_table(**kwargs)
    client.get_waiter("table_exists").wait(
        TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
    )
    if ttl_attribute:
        client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl_attribute},
        )
    table: dict[str, Any] = client.describe_table(TableName=table_name)["Table"]
    return table
