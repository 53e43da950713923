"""template.yaml's IAM as `sam deploy` creates it, and a small evaluator of its policies.

``Deployment`` expands the template with samtranslator (SAM's own translator), resolves the
conditions and every intrinsic to the names and ARNs a stack called ``STACK`` in ``ACCOUNT`` /
``REGION`` would have, and gives each function's (and the state machine's) policy.

``Policy.evaluate`` decides one request as IAM does for an identity policy: an explicit
``Deny`` that matches wins, else an ``Allow`` that matches allows, else it is denied.
Matched: ``Action``/``NotAction`` (``*`` and ``?`` wildcards, case-insensitive),
``Resource``/``NotResource`` (wildcards, case-sensitive) and ``Condition`` with the operators
``StringEquals``, ``StringNotEquals``, ``StringLike``, ``StringNotLike``, ``ArnEquals``,
``ArnLike``, alone or under ``ForAnyValue:``/``ForAllValues:``, on the keys a request carries
(``dynamodb:Attributes`` for DynamoDB item calls). Any other operator raises
``NotModelled``: a new condition in the template cannot pass unexamined.

Not modelled: resource-based policies (the topic's and queues' own policies, KMS key
policies), permission boundaries, SCPs and session policies; the ``IfExists`` suffix and
``Null``/numeric/date/bool operators; policy variables (``${aws:username}``); condition keys
other than those the recorder derives (``dynamodb:LeadingKeys``, ``dynamodb:Select``,
``dynamodb:ReturnValues``..., which the template does not use); what AWS managed policies
grant beyond the documented actions listed in ``AWS_MANAGED`` (they are taken as written
there, not read from AWS); calls AWS services make on a role's behalf (SNS's KMS calls,
Lambda's event source mappings, Athena's reads and writes of S3 and Glue).
"""

from __future__ import annotations

import copy
import fnmatch
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import boto3
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator

from tally.local.functions import parameter_defaults
from tally.local.template import conditions, load_template, template_path

ACCOUNT, REGION, PARTITION, STACK = "123456789012", "us-east-1", "aws", "tally"
STACK_ID = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/0d1e2f30-4a5b-6c7d-8e9f"
EXISTING = {
    "ExistingTableName": "Social",
    "ExistingTableStreamArn": (
        f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/Social/stream/2024-06-01T00:00:00.000"
    ),
}
EXAMPLE: dict[str, str] = {}
# A Global Table: the home Region's stack (here REGION) creates it; another Region's stack
# (REGION again, with eu-west-1 home) reconciles its replica there as an existing table.
GLOBAL_HOME = {"GlobalRegions": f"{REGION},eu-west-1", "HomeRegion": REGION}
GLOBAL_REPLICA = {"GlobalRegions": f"eu-west-1,{REGION}", "HomeRegion": "eu-west-1", **EXISTING}
# AWS managed policies the template attaches, with the actions AWS documents for them.
AWS_MANAGED = {
    f"arn:{PARTITION}:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole": (
        "logs:CreateLogGroup",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    ),
    f"arn:{PARTITION}:iam::aws:policy/AWSXrayWriteOnlyAccess": (
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
        "xray:GetSamplingRules",
        "xray:GetSamplingTargets",
        "xray:GetSamplingStatisticSummaries",
    ),
}
_OPERATORS = {
    "StringEquals",
    "StringNotEquals",
    "StringLike",
    "StringNotLike",
    "ArnEquals",
    "ArnLike",
}


class NotModelled(Exception):
    """The policy uses something this evaluator does not decide."""


@dataclass(frozen=True)
class Request:
    """One authorization IAM makes: an action on a resource, with its condition keys."""

    action: str
    resource: str
    context: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Statement:
    policy: str  # where it comes from: a managed policy, or role/inline policy
    index: int
    body: Mapping[str, Any]

    @property
    def label(self) -> str:
        sid = self.body.get("Sid")
        return f"{self.policy}#{sid or self.index}"

    @property
    def effect(self) -> str:
        return str(self.body["Effect"])

    @property
    def managed_by_aws(self) -> bool:
        return self.policy in AWS_MANAGED

    def actions(self) -> list[str]:
        return _list(self.body.get("Action", []))

    def resources(self) -> list[str]:
        return _list(self.body.get("Resource", []))

    def matches(self, request: Request) -> bool:
        return (
            self._matches_action(request.action)
            and self._matches_resource(request.resource)
            and _conditions_hold(self.body.get("Condition", {}), request.context)
        )

    def grants(self) -> Iterator[tuple[str, str]]:
        """Every (action, resource) pair the statement names."""
        for action in self.actions():
            for resource in self.resources():
                yield action, resource

    def _matches_action(self, action: str) -> bool:
        if "NotAction" in self.body:
            return not any(_action_like(action, p) for p in _list(self.body["NotAction"]))
        return any(_action_like(action, p) for p in self.actions())

    def _matches_resource(self, resource: str) -> bool:
        if "NotResource" in self.body:
            return not any(_like(resource, p) for p in _list(self.body["NotResource"]))
        return any(_like(resource, p) for p in self.resources())


@dataclass(frozen=True)
class Decision:
    allowed: bool
    allowed_by: tuple[Statement, ...] = ()
    denied_by: Statement | None = None

    @property
    def why(self) -> str:
        if self.denied_by is not None:
            return f"explicitly denied by {self.denied_by.label}"
        return "allowed" if self.allowed else "no statement allows it (implicit deny)"


@dataclass(frozen=True)
class Policy:
    """Every statement attached to one role."""

    role: str
    statements: tuple[Statement, ...]

    def evaluate(self, request: Request) -> Decision:
        denies = [s for s in self.statements if s.effect == "Deny" and s.matches(request)]
        if denies:
            return Decision(False, denied_by=denies[0])
        allows = tuple(s for s in self.statements if s.effect == "Allow" and s.matches(request))
        return Decision(bool(allows), allowed_by=allows)

    def without(self, action: str) -> Policy:
        """The same policy with ``action`` removed from every statement (a planted defect)."""
        kept = []
        for statement in self.statements:
            actions = [a for a in statement.actions() if a.lower() != action.lower()]
            if actions:
                kept.append(
                    Statement(
                        statement.policy, statement.index, {**statement.body, "Action": actions}
                    )
                )
        return Policy(self.role, tuple(kept))


def expand(
    parameters: Mapping[str, str], template: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """template.yaml as `sam deploy` hands it to CloudFormation: the code and the layer
    packaged to S3 (``s3://bucket/code.zip``, ``s3://bucket/layer.zip``) and every
    ``AWS::Serverless::*`` resource expanded by samtranslator."""
    source = copy.deepcopy(dict(template or load_template(template_path())))
    source["Globals"]["Function"]["CodeUri"] = "s3://bucket/code.zip"  # as `sam package` does
    for body in source["Resources"].values():
        if body["Type"] == "AWS::Serverless::LayerVersion":
            body["Properties"]["ContentUri"] = "s3://bucket/layer.zip"
    translator = Translator(None, Parser(), boto_session=boto3.Session(region_name=REGION))
    translated: dict[str, Any] = translator.translate(
        source, parameter_values=dict(parameters), get_managed_policy_map=dict
    )
    return translated


class Deployment:
    """The stack ``sam deploy`` would create from template.yaml with ``parameters``."""

    def __init__(self, parameters: Mapping[str, str], template: Mapping[str, Any] | None = None):
        self.parameters = dict(parameters)
        translated = expand(parameters, template)
        self.values = parameter_defaults(translated) | self.parameters
        self.lists = {
            name
            for name, spec in translated.get("Parameters", {}).items()
            if spec.get("Type") == "CommaDelimitedList"
        }
        self.conditions = conditions(translated, self.values | {"AWS::Region": REGION})
        self.resources: dict[str, dict[str, Any]] = {
            name: body
            for name, body in translated["Resources"].items()
            if self.conditions.get(body.get("Condition", ""), True)
        }
        self._resolving: set[str] = set()

    @property
    def existing_table(self) -> str:
        return self.values.get("ExistingTableName", "")

    # --- what the stack holds ----------------------------------------------------------

    def functions(self) -> dict[str, str]:
        """Each Lambda function's logical id and handler."""
        return {
            name: body["Properties"]["Handler"]
            for name, body in self.resources.items()
            if body["Type"] == "AWS::Lambda::Function"
        }

    def policy(self, principal: str) -> Policy:
        """The statements of the role a function or state machine runs as."""
        props = self.resources[principal]["Properties"]
        role_ref = props.get("Role") or props.get("RoleArn")
        role = role_ref["Fn::GetAtt"][0] if isinstance(role_ref, dict) else None
        if role is None or role not in self.resources:
            raise NotModelled(f"{principal}: its role {role_ref!r} is not in the stack")
        body = self.resources[role]["Properties"]
        statements: list[Statement] = []
        for managed in body.get("ManagedPolicyArns", []):
            if isinstance(managed, dict) and set(managed) == {"Ref"}:
                document = self.resources[managed["Ref"]]["Properties"]["PolicyDocument"]
                statements += self._statements(managed["Ref"], document)
            else:
                arn = self.resolve(managed)
                if arn not in AWS_MANAGED:
                    raise NotModelled(f"{role}: managed policy {arn} is not modelled")
                document = {
                    "Statement": [
                        {"Effect": "Allow", "Action": list(AWS_MANAGED[arn]), "Resource": "*"}
                    ]
                }
                statements += self._statements(arn, document)
        for inline in body.get("Policies", []):
            statements += self._statements(
                f"{role}/{inline['PolicyName']}", inline["PolicyDocument"]
            )
        return Policy(role, tuple(statements))

    def _statements(self, name: str, document: Mapping[str, Any]) -> list[Statement]:
        resolved = self.resolve(document)
        return [Statement(name, i, s) for i, s in enumerate(_list(resolved["Statement"]))]

    # --- ARNs of what a call names ----------------------------------------------------

    def table_arn(self, logical: str) -> str:
        if logical == "Table" and self.existing_table:
            return _arn("dynamodb", f"table/{self.existing_table}")
        if logical == "Table" and "GlobalTable" in self.resources:  # the home Region's stack
            return str(self.get_att("GlobalTable", "Arn"))
        return str(self.get_att(logical, "Arn"))

    def arn(self, kind: str, logical: str, detail: str | None = None) -> str:
        """The ARN IAM checks for a call on ``logical`` (an ``index`` names ``detail``)."""
        if kind == "table":
            return self.table_arn(logical)
        if kind == "index":
            return f"{self.table_arn(logical)}/index/{detail}"
        if kind == "stream":
            return f"{self.table_arn(logical)}/stream/{detail or '2024-06-01T00:00:00.000'}"
        if kind in ("queue", "bucket"):
            base = str(self.get_att(logical, "Arn"))
            return f"{base}/{detail}" if kind == "bucket" and detail else base
        if kind in ("topic", "statemachine", "function"):
            return (
                str(self.get_att(logical, "Arn")) if kind == "function" else str(self.ref(logical))
            )
        if kind == "workgroup":
            return _arn("athena", f"workgroup/{self.ref(logical)}")
        if kind == "parameter":  # a name with a leading "/" gives one "/" after "parameter"
            return _arn("ssm", f"parameter/{str(self.ref(logical)).lstrip('/')}")
        raise NotModelled(f"no ARN for a {kind} ({logical})")

    # --- intrinsics -------------------------------------------------------------------

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.resolve(item) for item in node]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            [(key, value)] = node.items()
            if key == "Ref":
                return self.ref(value)
            if key == "Fn::GetAtt":
                logical, attribute = value.split(".", 1) if isinstance(value, str) else value
                return self.get_att(logical, attribute)
            if key == "Fn::Sub":
                text, extra = (value, {}) if isinstance(value, str) else value
                return self._sub(text, self.resolve(extra))
            if key == "Fn::If":
                condition, yes, no = value
                return self.resolve(yes if self.conditions[condition] else no)
            if key == "Fn::Join":
                separator, items = value
                return separator.join(str(i) for i in self.resolve(items))
            if key == "Fn::Select":
                index, items = value
                return self.resolve(items)[int(self.resolve(index))]
            if key == "Fn::Split":
                separator, text = value
                return str(self.resolve(text)).split(separator)
        return {key: self.resolve(value) for key, value in node.items()}

    def _sub(self, text: str, extra: Mapping[str, Any]) -> str:
        def one(match: re.Match[str]) -> str:
            name = match[1]
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in extra:
                return str(extra[name])
            if "." in name:
                logical, attribute = name.split(".", 1)
                return str(self.get_att(logical, attribute))
            return str(self.ref(name))

        return re.sub(r"\$\{([^}]+)\}", one, text)

    def ref(self, name: str) -> Any:
        pseudo = {
            "AWS::AccountId": ACCOUNT,
            "AWS::Region": REGION,
            "AWS::Partition": PARTITION,
            "AWS::StackName": STACK,
            "AWS::StackId": STACK_ID,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": None,
        }
        if name in pseudo:
            return pseudo[name]
        if name in self.values:
            value = self.values[name]
            return value.split(",") if name in self.lists else value
        kind = self._type(name)
        physical = self._name(name)
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{physical}"
        if kind == "AWS::SNS::Topic":
            return _arn("sns", physical, sep=":")
        if kind == "AWS::StepFunctions::StateMachine":
            return _arn("states", f"stateMachine:{physical}", sep=":")
        if kind == "AWS::IAM::ManagedPolicy":
            return f"arn:{PARTITION}:iam::{ACCOUNT}:policy/{physical}"
        return physical

    def get_att(self, logical: str, attribute: str) -> Any:
        kind, physical = self._type(logical), self._name(logical)
        if attribute in ("QueueName", "TopicName", "Name"):
            return physical
        # A Global Table's Arn and StreamArn are its replica's in the stack's Region.
        if kind in ("AWS::DynamoDB::Table", "AWS::DynamoDB::GlobalTable"):
            table = _arn("dynamodb", f"table/{physical}")
            return table if attribute == "Arn" else f"{table}/stream/2024-06-01T00:00:00.000"
        arns = {
            "AWS::SQS::Queue": lambda: _arn("sqs", physical, sep=":"),
            "AWS::SNS::Topic": lambda: self.ref(logical),
            "AWS::KMS::Key": lambda: _arn("kms", f"key/{physical}"),
            "AWS::S3::Bucket": lambda: f"arn:{PARTITION}:s3:::{physical}",
            "AWS::Logs::LogGroup": lambda: _arn("logs", f"log-group:{physical}:*", sep=":"),
            "AWS::Lambda::Function": lambda: _arn("lambda", f"function:{physical}", sep=":"),
            "AWS::IAM::Role": lambda: f"arn:{PARTITION}:iam::{ACCOUNT}:role/{physical}",
            "AWS::StepFunctions::StateMachine": lambda: self.ref(logical),
        }
        if attribute == "Arn" and kind in arns:
            return arns[kind]()
        raise NotModelled(f"Fn::GetAtt {logical}.{attribute} ({kind})")

    def _type(self, logical: str) -> str:
        if logical not in self.resources:
            raise NotModelled(f"{logical} is not a resource of this deployment")
        return str(self.resources[logical]["Type"])

    def _name(self, logical: str) -> str:
        """The physical name: the one the template gives, else one CloudFormation would."""
        props = self.resources[logical].get("Properties", {})
        names = ("TableName", "QueueName", "TopicName", "FunctionName", "LogGroupName")
        for key in (*names, "StateMachineName", "Name"):
            if key in props:
                if logical in self._resolving:
                    raise NotModelled(f"{logical}'s name refers to itself")
                self._resolving.add(logical)
                try:
                    return str(self.resolve(props[key]))
                finally:
                    self._resolving.discard(logical)
        if "DatabaseInput" in props:
            return str(self.resolve(props["DatabaseInput"]["Name"]))
        name = f"{STACK}-{logical}-1x2y3z"
        return name.lower() if self._type(logical) == "AWS::S3::Bucket" else name


def _arn(service: str, resource: str, sep: str = ":") -> str:
    return f"arn:{PARTITION}:{service}:{REGION}:{ACCOUNT}{sep}{resource}"


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _like(value: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def _action_like(action: str, pattern: str) -> bool:
    return _like(action.lower(), pattern.lower())


def _conditions_hold(block: Mapping[str, Any], context: Mapping[str, Sequence[str]]) -> bool:
    """Every operator of the block holds (IAM ANDs operators and keys, ORs a key's values)."""
    for operator, keys in block.items():
        quantifier, _, name = operator.rpartition(":")
        if name not in _OPERATORS or quantifier not in ("", "ForAnyValue", "ForAllValues"):
            raise NotModelled(f"condition operator {operator}")
        for key, wanted in keys.items():
            values = context.get(key)
            patterns = [str(w) for w in _list(wanted)]

            def one(value: str, name: str = name, patterns: list[str] = patterns) -> bool:
                if name in ("StringLike", "StringNotLike", "ArnLike"):
                    hit = any(_like(value, p) for p in patterns)
                else:
                    hit = value in patterns
                return not hit if "Not" in name else hit

            if quantifier == "ForAllValues":
                if values and not all(one(v) for v in values):
                    return False
            elif quantifier == "ForAnyValue":
                if not values or not any(one(v) for v in values):
                    return False
            elif values is None or len(values) != 1 or not one(values[0]):
                return False
    return True


# --- recorded calls against a deployment -------------------------------------------------


def request_of(call: Any, deployment: Deployment) -> Request:
    """The IAM request a recorded call (``tests.harness.iam_calls.Call``) makes there."""
    if call.kind == "*":
        return Request(call.action, "*")
    if call.resource.startswith("?"):
        raise NotModelled(
            f"{call.function}: {call.action} names {call.resource[1:]!r}, which its "
            f"environment does not give it (called at {call.site})"
        )
    context = {"dynamodb:Attributes": call.attributes} if call.attributes is not None else {}
    return Request(call.action, deployment.arn(call.kind, call.resource, call.detail), context)


def denials(
    calls: Sequence[Any], deployment: Deployment, policies: Mapping[str, Policy] | None = None
) -> list[str]:
    """Why each recorded call its function's policy does not allow would fail in AWS."""
    policies = policies or {}
    found: dict[tuple[str, str, str], str] = {}
    for call in calls:
        policy = policies.get(call.function) or deployment.policy(call.function)
        try:
            request = request_of(call, deployment)
        except NotModelled as error:
            found[(call.function, call.action, call.resource)] = str(error)
            continue
        decision = policy.evaluate(request)
        if not decision.allowed:
            attributes = f" naming {list(call.attributes)}" if call.attributes else ""
            found.setdefault(
                (call.function, request.action, request.resource),
                f"{call.function}: {request.action} on {request.resource}{attributes}: "
                f"{decision.why} (called at {call.site})",
            )
    return sorted(found.values())


def grants(
    deployment: Deployment, functions: Sequence[str]
) -> Iterator[tuple[str, Statement, str, str]]:
    """(function, statement, action, resource) for every Allow the template writes."""
    for function in functions:
        for statement in deployment.policy(function).statements:
            if statement.effect == "Allow" and not statement.managed_by_aws:
                for action, resource in statement.grants():
                    yield function, statement, action, resource


def unexercised(
    calls: Sequence[Any], deployment: Deployment, functions: Sequence[str]
) -> list[tuple[str, str, str, str]]:
    """Grants no recorded call of that function used: (function, statement, action, resource)."""
    requests: dict[str, list[Request]] = {}
    for call in calls:
        with _suppress_not_modelled():
            requests.setdefault(call.function, []).append(request_of(call, deployment))
    unused = []
    for function, statement, action, resource in grants(deployment, functions):
        single = Statement(
            statement.policy,
            statement.index,
            {**statement.body, "Action": action, "Resource": resource},
        )
        if not any(single.matches(r) for r in requests.get(function, [])):
            unused.append((function, statement.label, action, resource))
    return unused


class _suppress_not_modelled:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is not None and issubclass(kind, NotModelled)


def without_action(template: Mapping[str, Any], action: str) -> dict[str, Any]:
    """template.yaml with ``action`` taken out of every policy statement (a planted defect)."""
    planted = copy.deepcopy(dict(template))

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            if "Effect" in node and "Action" in node:
                actions = [a for a in _list(node["Action"]) if a != action]
                node["Action"] = actions or ["none:Nothing"]
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    strip(planted["Resources"])
    return planted
