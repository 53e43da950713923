"""template.yaml deployed in an emulated account: moto's CloudFormation on moto's server.

`sam deploy` against moto "succeeds", but moto does not run the ``AWS::Serverless`` transform
and silently leaves out every function, mapping and the state machine. So the template is
expanded as `sam deploy` expands it (``tests.harness.iam.expand``: samtranslator, code and
layer packaged to S3), put in a moto bucket and created with ``create_stack`` and a
``TemplateURL`` (not through a change set, which loses the Outputs in moto): once on the
example table, once on an existing table created first in moto with its stream.

Then what moto can answer is read back through each service's API and compared with the
template resolved against the stack as created (real names and ARNs): tables, stream and
index; queues and their redrive; the topic; functions' handlers, roles, sizes and
environment; every event source mapping's settings; the outputs. The two mappings, read
back through Lambda's API, must also be what the local pump emulates.

moto's CloudFormation skips the types in ``NOT_CREATED`` (it warns, and the stack still
completes): nothing is stripped from the template, and the test requires that exactly the
resources of those types are missing. docs/operations.md says where each is checked instead.
"""

from __future__ import annotations

import ast
import io
import json
import re
import urllib.parse
import uuid
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from tally.local.functions import parameter_defaults
from tally.local.pump import Pump
from tally.local.stream_trigger import MappingSettings
from tally.local.template import load_template, template_path
from tally.reconciler.repair.switches import Switches, parse_switches
from tests.harness.iam import Deployment, NotModelled, expand

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS::")

# Resource types moto's CloudFormation does not create, and where each is checked instead.
NOT_CREATED = {
    "AWS::CloudWatch::Alarm": "alarms: cfn-lint in `make sam`, test_template_operations.py, "
    "test_template_wiring.py",
    "AWS::SNS::TopicPolicy": "the topic's policy for CloudWatch: cfn-lint in `make sam` only",
    "AWS::Glue::Database": "the export engine's database: test_template_audit.py, "
    "test_state_machine_iam.py",
    "AWS::Athena::WorkGroup": "the export engine's workgroup: test_template_audit.py",
    "AWS::Lambda::EventInvokeConfig": "the audit's on-failure queue: test_template_operations.py",
    "AWS::Scheduler::Schedule": "the audit schedules: test_template_audit.py, "
    "test_template_operations.py",
    "AWS::ApiGatewayV2::Api": "the writer's HTTP API: test_template_operations.py, "
    "tests/integration/test_writer_api*.py",
    "AWS::ApiGatewayV2::Stage": "the HTTP API's stage (logs, throttling): "
    "test_template_operations.py",
}
# Lambda's values for a stream mapping's settings the API leaves out (moto leaves them out).
LAMBDA_DEFAULTS: dict[str, Any] = {
    "BatchSize": 100,
    "MaximumBatchingWindowInSeconds": 0,
    "MaximumRetryAttempts": -1,
    "BisectBatchOnFunctionError": False,
    "ParallelizationFactor": 1,
    "FunctionResponseTypes": [],
}
# Each setting the pump emulates, as the pump holds it and as Lambda's API reports it.
PUMP_EMULATES: dict[str, Callable[[MappingSettings], Any]] = {
    "BatchSize": lambda s: s.batch_size,
    "MaximumBatchingWindowInSeconds": lambda s: s.window_seconds,
    "MaximumRetryAttempts": lambda s: s.max_retries,
    "BisectBatchOnFunctionError": lambda s: s.bisect,
    "FunctionResponseTypes": lambda s: ["ReportBatchItemFailures"] if s.partial_responses else [],
    "ParallelizationFactor": lambda s: s.parallelization,
}
PUMP_FIELDS = {
    "batch_size",
    "window_seconds",
    "max_retries",
    "bisect",
    "partial_responses",
    "parallelization",
}


class AsCreated(Deployment):
    """The template resolved against the stack moto created: its physical names and ARNs."""

    def __init__(
        self,
        parameters: Mapping[str, str],
        stack_name: str,
        stack_id: str,
        physical: Mapping[str, str],
        stream_arns: Mapping[str, str],
    ):
        super().__init__(parameters)
        self.stack_name, self.stack_id = stack_name, stack_id
        self.physical = dict(physical)
        self.stream_arns = dict(stream_arns)

    def ref(self, name: str) -> Any:
        if name == "AWS::StackName":
            return self.stack_name
        if name == "AWS::StackId":
            return self.stack_id
        return super().ref(name)

    def get_att(self, logical: str, attribute: str) -> Any:
        if attribute == "StreamArn":
            return self.stream_arns[logical]
        return super().get_att(logical, attribute)

    def _name(self, logical: str) -> str:
        physical = self.physical.get(logical)
        if not physical:
            raise NotModelled(f"{logical} has no physical id in the emulated stack")
        if physical.startswith(("arn:", "https://")):  # topic, state machine, policy, queue
            return re.split(r"[:/]", physical)[-1]
        return physical


@dataclass
class Emulated:
    """One deployment of the template in moto: the stack, the clients, the template as created."""

    mode: str
    table: str  # the table the functions reconcile
    stream_arn: str  # its stream, as DynamoDB reports it
    summaries: list[dict[str, Any]]
    stack: dict[str, Any]
    template: AsCreated
    clients: Callable[[str], Any]

    def physical(self, logical: str) -> str:
        return self.template.physical[logical]

    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        return {n: b for n, b in self.template.resources.items() if b["Type"] == kind}

    def created(self) -> set[str]:
        return {s["LogicalResourceId"] for s in self.summaries if s["LogicalResourceId"]}

    def resource_table(self) -> list[tuple[str, str, str]]:
        """(logical id, type, what moto did) for every resource this deployment declares."""
        created = self.created()
        return [
            (name, body["Type"], "created" if name in created else "not created")
            for name, body in sorted(self.template.resources.items())
        ]


def _stub_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("index.py", "def handler(event, context):\n    return None\n")
    return buffer.getvalue()


def _packaged(template: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The S3 objects the expanded template's functions and layers are packaged to."""
    found = set()
    for body in template["Resources"].values():
        props = body.get("Properties", {})
        location = props.get("Code") or props.get("Content")
        if body["Type"] in ("AWS::Lambda::Function", "AWS::Lambda::LayerVersion"):
            found.add((location["S3Bucket"], location["S3Key"]))
    return found


def _existing_table(dynamodb: Any, name: str) -> str:
    """An adopter's table with its stream, as ExistingTableName expects it; its stream ARN."""
    keys = {"PK": "HASH", "SK": "RANGE"}
    dynamodb.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in keys],
        KeySchema=[{"AttributeName": k, "KeyType": t} for k, t in keys.items()],
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    return str(dynamodb.describe_table(TableName=name)["Table"]["LatestStreamArn"])


# A Global Table's stack outside its home Region (here us-east-1, eu-west-1 home): it
# reconciles the replica in its Region as an existing table. The home Region's stack creates
# an AWS::DynamoDB::GlobalTable, which moto's CloudFormation does not: that layout is proven on
# the template in tests/unit/template/test_template_global_table.py.
GLOBAL = {"GlobalRegions": "eu-west-1,us-east-1", "HomeRegion": "eu-west-1"}


@pytest.fixture(scope="module", params=["example table", "existing table", "global replica"])
def emulated(request: pytest.FixtureRequest, moto_endpoint: str) -> Emulated:
    # moto reads a TemplateURL on 127.0.0.1 as a bucket's virtual host: name the host.
    endpoint = moto_endpoint.replace("127.0.0.1", "localhost")

    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1")

    suffix = uuid.uuid4().hex[:6]
    parameters: dict[str, str] = {}
    if request.param in ("existing table", "global replica"):
        name = f"Social-{suffix}"
        parameters = {
            "ExistingTableName": name,
            "ExistingTableStreamArn": _existing_table(client("dynamodb"), name),
        }
    if request.param == "global replica":
        parameters |= GLOBAL

    # As `sam deploy` does: the code and the layer to S3, then the expanded template.
    expanded = expand(parameters)
    s3, templates = client("s3"), f"templates-{suffix}"
    for bucket in {bucket for bucket, _ in _packaged(expanded)} | {templates}:
        s3.create_bucket(Bucket=bucket)
    for bucket, key in _packaged(expanded):
        s3.put_object(Bucket=bucket, Key=key, Body=_stub_zip())
    s3.put_object(Bucket=templates, Key="tally.json", Body=json.dumps(expanded))

    stack_name = f"tally-{request.param.split()[0]}-{suffix}"
    cloudformation = client("cloudformation")
    cloudformation.create_stack(
        StackName=stack_name,
        TemplateURL=f"{endpoint}/{templates}/tally.json",
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
    )
    [stack] = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    pages = cloudformation.get_paginator("list_stack_resources").paginate(StackName=stack_name)
    summaries = [s for page in pages for s in page["StackResourceSummaries"]]
    # moto lists each resource it skipped without a logical id.
    listed = [s for s in summaries if s["LogicalResourceId"]]
    physical = {s["LogicalResourceId"]: s.get("PhysicalResourceId", "") for s in listed}
    streams = {
        s["LogicalResourceId"]: client("dynamodb")
        .describe_table(TableName=s["PhysicalResourceId"])["Table"]
        .get("LatestStreamArn", "")
        for s in listed
        if s["ResourceType"] == "AWS::DynamoDB::Table"
    }
    template = AsCreated(parameters, stack_name, stack["StackId"], physical, streams)
    table = parameters.get("ExistingTableName") or physical["Table"]
    stream_arn = parameters.get("ExistingTableStreamArn") or streams["Table"]
    return Emulated(request.param, table, stream_arn, summaries, stack, template, client)


def _plain(value: Any) -> Any:
    """A value as both sides can be compared: parameters are strings, APIs answer numbers."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(int(value)) if float(value).is_integer() else str(value)
    return value


def _differences(what: str, declared: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    return [
        f"{what}.{key}: template says {_plain(value)!r}, the stack has {_plain(actual.get(key))!r}"
        for key, value in declared.items()
        if _plain(value) != _plain(actual.get(key))
    ]


# --- the stack ---------------------------------------------------------------------------


def test_every_resource_moto_supports_is_created_and_only_those_are_missing(
    emulated: Emulated,
) -> None:
    assert emulated.stack["StackStatus"] == "CREATE_COMPLETE", emulated.stack
    table = emulated.resource_table()
    print(f"\n{emulated.mode}: {len(table)} resources")
    for name, kind, fate in table:
        print(f"  {name:40} {kind:36} {fate}")
    missing = {name for name, _, fate in table if fate == "not created"}
    unsupported = {n for n, kind, _ in table if kind in NOT_CREATED}
    assert missing == unsupported, (
        f"created though moto is said not to: {sorted(unsupported - missing)}; "
        f"missing though moto supports its type: {sorted(missing - unsupported)}"
    )
    undeclared = emulated.created() - set(emulated.template.resources)
    assert not undeclared, f"created though its condition is false: {sorted(undeclared)}"
    if emulated.mode != "example table":
        assert not {"Table", "GlobalTable"} & emulated.created()
    # The layer has no physical id in moto's listing; Lambda has it.
    layers = emulated.clients("lambda").list_layers()["Layers"]
    for name in emulated.of_type("AWS::Lambda::LayerVersion"):
        assert any(
            layer["LayerName"].startswith(f"{emulated.template.stack_name}-{name}")
            for layer in layers
        ), name


def test_outputs_are_the_template_s(emulated: Emulated) -> None:
    outputs = {o["OutputKey"]: o["OutputValue"] for o in emulated.stack["Outputs"]}
    expected, unresolved = {}, []
    for key, output in expand(emulated.template.parameters)["Outputs"].items():
        try:
            expected[key] = emulated.template.resolve(output["Value"])
        except NotModelled:  # names a resource moto does not create
            unresolved.append(key)
    assert {k: outputs.get(k) for k in expected} == expected
    assert unresolved == ["WriterApiUrl"]  # the HTTP API
    assert outputs["TableName"] == emulated.table
    assert outputs["TableStreamArn"] == emulated.stream_arn


# --- data, alerts, queues ----------------------------------------------------------------


def test_tables_their_keys_index_and_stream(emulated: Emulated) -> None:
    dynamodb = emulated.clients("dynamodb")
    tables = emulated.of_type("AWS::DynamoDB::Table")
    assert ("Table" in tables) == (emulated.mode == "example table")
    for logical, body in tables.items():
        props = emulated.template.resolve(body["Properties"])
        described = dynamodb.describe_table(TableName=emulated.physical(logical))["Table"]
        assert described["KeySchema"] == props["KeySchema"], logical
        assert sorted(described["AttributeDefinitions"], key=str) == sorted(
            props["AttributeDefinitions"], key=str
        )
        indexes = {
            i["IndexName"]: (i["KeySchema"], i["Projection"])
            for i in described.get("GlobalSecondaryIndexes", [])
        }
        assert indexes == {
            i["IndexName"]: (i["KeySchema"], i["Projection"])
            for i in props.get("GlobalSecondaryIndexes", [])
        }, logical
        assert described["BillingModeSummary"]["BillingMode"] == props["BillingMode"]
        stream = props.get("StreamSpecification")
        if stream:
            assert described["StreamSpecification"] == {
                "StreamEnabled": True,
                "StreamViewType": stream["StreamViewType"],
            }
            assert described["LatestStreamArn"]
        else:  # the audit table: its own writes must not trigger the reconciler
            assert not described.get("StreamSpecification", {}).get("StreamEnabled"), logical
        # moto's CloudFormation does not apply TimeToLive, point-in-time recovery or SSE:
        # test_template_wiring.py checks them in the template.
    if emulated.mode == "example table":
        described = dynamodb.describe_table(TableName=emulated.table)["Table"]
        assert [i["IndexName"] for i in described["GlobalSecondaryIndexes"]] == ["SequenceIndex"]


def test_queues_and_their_redrive(emulated: Emulated) -> None:
    sqs = emulated.clients("sqs")
    queues = emulated.of_type("AWS::SQS::Queue")
    assert queues
    problems = []
    for logical, body in queues.items():
        declared = emulated.template.resolve(body["Properties"])
        attributes = sqs.get_queue_attributes(
            QueueUrl=emulated.physical(logical), AttributeNames=["All"]
        )["Attributes"]
        if "RedrivePolicy" in attributes:
            attributes["RedrivePolicy"] = json.loads(attributes["RedrivePolicy"])
        problems += _differences(logical, declared, attributes)
    assert not problems
    redrive = json.loads(
        sqs.get_queue_attributes(
            QueueUrl=emulated.physical("RecheckQueue"), AttributeNames=["RedrivePolicy"]
        )["Attributes"]["RedrivePolicy"]
    )
    dead_letters = sqs.get_queue_attributes(
        QueueUrl=emulated.physical("RecheckDeadLetterQueue"), AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    assert redrive["deadLetterTargetArn"] == dead_letters


def test_the_alert_topic_is_encrypted_with_its_key(emulated: Emulated) -> None:
    [(logical, body)] = emulated.of_type("AWS::SNS::Topic").items()
    attributes = emulated.clients("sns").get_topic_attributes(TopicArn=emulated.physical(logical))[
        "Attributes"
    ]
    declared = emulated.template.resolve(body["Properties"])
    assert attributes["DisplayName"] == declared["DisplayName"]
    assert (
        attributes["KmsMasterKeyId"] == declared["KmsMasterKeyId"] == emulated.physical("AlertKey")
    )


# --- functions and their mappings --------------------------------------------------------


def test_functions_handlers_roles_sizes_and_environment(emulated: Emulated) -> None:
    lambda_ = emulated.clients("lambda")
    functions = emulated.of_type("AWS::Lambda::Function")
    assert len(functions) >= 6
    problems = []
    for logical, body in functions.items():
        # Layers, Architectures, TracingConfig and LoggingConfig: moto drops them.
        compared = ("Handler", "Runtime", "Timeout", "MemorySize", "Role")
        declared = emulated.template.resolve({k: body["Properties"][k] for k in compared})
        config = lambda_.get_function_configuration(FunctionName=emulated.physical(logical))
        problems += _differences(logical, declared, config)
        variables = {}
        for name, value in body["Properties"]["Environment"]["Variables"].items():
            try:
                variables[name] = emulated.template.resolve(value)
            except NotModelled:  # names a resource moto does not create; moto leaves it out
                continue
        problems += _differences(
            f"{logical}.Environment", variables, config["Environment"]["Variables"]
        )
        deployed = config["Environment"]["Variables"]
        assert deployed["TABLE_NAME"] == emulated.table, logical
        if emulated.mode == "global replica":
            assert (deployed["GLOBAL_REGIONS"], deployed["HOME_REGION"]) == (
                GLOBAL["GlobalRegions"],
                GLOBAL["HomeRegion"],
            ), logical
    assert not problems


def _mappings(emulated: Emulated) -> dict[str, dict[str, Any]]:
    """Each mapping of the stack by logical id, as Lambda's API reports it."""
    listed = emulated.clients("lambda").list_event_source_mappings()["EventSourceMappings"]
    by_uuid = {m["UUID"]: m for m in listed}
    return {
        logical: by_uuid[emulated.physical(logical)]
        for logical in emulated.of_type("AWS::Lambda::EventSourceMapping")
    }


def test_every_mapping_is_deployed_as_the_template_declares_it(emulated: Emulated) -> None:
    mappings = _mappings(emulated)
    assert set(mappings) == {"ReconcilerFunctionStream", "RecheckFunctionRechecks"}
    problems = []
    for logical, body in emulated.of_type("AWS::Lambda::EventSourceMapping").items():
        declared = dict(emulated.template.resolve(body["Properties"]))
        mapping = mappings[logical]
        function_name = declared.pop("FunctionName")
        assert mapping["FunctionArn"].endswith(f":function:{function_name}"), logical
        problems += _differences(logical, declared, mapping)
    assert not problems
    stream = mappings["ReconcilerFunctionStream"]
    assert stream["EventSourceArn"] == emulated.stream_arn
    assert stream["State"] == "Enabled"
    assert stream["DestinationConfig"]["OnFailure"]["Destination"] == (
        emulated.template.get_att("StreamFailureQueue", "Arn")
    )
    filters = stream["FilterCriteria"]["Filters"]
    assert [json.loads(f["Pattern"]) for f in filters] == [
        json.loads(parameter_defaults(load_template(template_path()))["StreamFilterPattern"])
    ]


def pump_settings() -> MappingSettings:
    """The stream mapping's settings as the local pump reads them (tally.local.runner.pump)."""
    return MappingSettings.from_template(load_template(template_path()))


def test_the_mappings_are_what_the_pump_emulates(emulated: Emulated) -> None:
    settings = pump_settings()
    unchecked = {f.name for f in fields(MappingSettings)} - PUMP_FIELDS
    assert not unchecked, f"the pump emulates {sorted(unchecked)}, which this test ignores"
    mappings = _mappings(emulated)
    stream = LAMBDA_DEFAULTS | mappings["ReconcilerFunctionStream"]
    differences = [
        f"{setting}: deployed {stream[setting]!r}, the pump emulates {emulates(settings)!r}"
        for setting, emulates in PUMP_EMULATES.items()
        if _plain(stream[setting]) != _plain(emulates(settings))
    ]
    assert not differences, "the stream mapping as deployed is not what the pump plays: " + (
        "; ".join(differences)
    )
    # The recheck queue's trigger, as the pump wires it.
    reader = SimpleNamespace(positions=dict, stream_arn="")
    pump = Pump(reader, print, print, None, "", "", settings)  # type: ignore[arg-type]
    rechecks = mappings["RecheckFunctionRechecks"]
    assert rechecks["BatchSize"] == pump.rechecks.batch_size
    # The pump always honours a partial batch response from the recheck handler.
    assert rechecks["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


# --- the repair switches -----------------------------------------------------------------

REPAIRING = {"ReconcilerFunction", "RecheckFunction", "AuditFunction", "AuditCandidatesFunction"}


def _documents(emulated: Emulated, role_arn: str) -> list[Any]:
    """The policy documents the emulated account's IAM holds for a role: its inline policies
    (moto lists no managed policy attached by CloudFormation: those are read below)."""
    iam = emulated.clients("iam")
    role = role_arn.rsplit("/", 1)[-1]
    return [
        iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
        for name in iam.list_role_policies(RoleName=role)["PolicyNames"]
    ]


def _managed_document(emulated: Emulated, logical: str) -> Any:
    iam, arn = emulated.clients("iam"), emulated.physical(logical)
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    return iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]


def _ssm_grants(documents: list[Any]) -> list[tuple[str, str, str]]:
    """(effect, action, resource) of every statement naming SSM (or every action)."""
    grants = []
    for document in documents:
        if isinstance(document, str):  # moto keeps what CloudFormation gave it: JSON, or a repr
            text = urllib.parse.unquote(document)
            try:
                document = json.loads(text)
            except ValueError:
                document = ast.literal_eval(text)
        for statement in _listed(document["Statement"]):
            for action in _listed(statement.get("Action", [])):
                if action.startswith("ssm:") or action == "*":
                    for resource in _listed(statement.get("Resource", [])):
                        grants.append((statement["Effect"], action, resource))
    return grants


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_the_repair_switches_hold_the_template_s_values_and_only_the_repairing_functions_read_them(
    emulated: Emulated,
) -> None:
    outputs = {o["OutputKey"]: o["OutputValue"] for o in emulated.stack["Outputs"]}
    name = outputs["RepairSwitchesParameter"]
    assert name == f"/tally/{emulated.template.stack_name}/repair-switches"
    value = emulated.clients("ssm").get_parameter(Name=name)["Parameter"]["Value"]
    # The template's parameter defaults: RepairsEnabled true, DryRun false, RepairBudget 25.
    assert parse_switches(value, name) == Switches(True, False, 25, name)
    account = emulated.stack["StackId"].split(":")[4]
    read = [("Allow", "ssm:GetParameter", f"arn:aws:ssm:us-east-1:{account}:parameter{name}")]
    # The one grant: in the managed policy the repairing functions' roles carry...
    assert _ssm_grants([_managed_document(emulated, "ReconcilerPolicy")]) == read
    other_managed = set(emulated.of_type("AWS::IAM::ManagedPolicy")) - {"ReconcilerPolicy"}
    assert not _ssm_grants([_managed_document(emulated, m) for m in other_managed])
    lambda_ = emulated.clients("lambda")
    carrying = set()
    for logical, body in emulated.of_type("AWS::Lambda::Function").items():
        config = lambda_.get_function_configuration(FunctionName=emulated.physical(logical))
        # ... and no inline policy of any function's role names SSM.
        assert not _ssm_grants(_documents(emulated, config["Role"])), logical
        role = emulated.template.resources[body["Properties"]["Role"]["Fn::GetAtt"][0]]
        if {"Ref": "ReconcilerPolicy"} in role["Properties"].get("ManagedPolicyArns", []):
            carrying.add(logical)
            assert config["Environment"]["Variables"]["REPAIR_SWITCHES_PARAMETER"] == name
    assert carrying == REPAIRING
