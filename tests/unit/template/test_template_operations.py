"""template.yaml as an operator needs it: alarms per function, failure destinations, scoped
grants, an HTTP API that logs and throttles. The grants are read from SAM's own translation,
so a policy SAM would add behind the template's back is seen too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

from tally.local.functions import functions
from tally.local.template import load_template, template_path

TEMPLATE = load_template(template_path())
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
FUNCTION_IDS = [spec.logical_id for spec in functions(TEMPLATE)]
# SAM attaches these to a generated role for stream and queue triggers: every stream or
# queue in the account.
ACCOUNT_WIDE = ("AWSLambdaDynamoDBExecutionRole", "AWSLambdaSQSQueueExecutionRole")
STREAM_READ = {"dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:DescribeStream"}
QUEUE_RECEIVE = {"sqs:ReceiveMessage", "sqs:DeleteMessage"}


class _NoManagedPolicies:
    """SAM looks managed policies up by name; the template names none."""

    def load(self) -> dict[str, str]:
        return {}


@pytest.fixture(scope="module")
def translated(monkeypatch_module: pytest.MonkeyPatch) -> dict[str, Any]:
    """The CloudFormation SAM produces (code locations as after `sam package`)."""
    monkeypatch_module.setenv("AWS_DEFAULT_REGION", "us-east-1")
    document = yaml_parse(template_path().read_text())
    document["Globals"]["Function"]["CodeUri"] = "s3://bucket/code.zip"
    for body in document["Resources"].values():
        if body["Type"] == "AWS::Serverless::LayerVersion":
            body["Properties"]["ContentUri"] = "s3://bucket/layer.zip"
    output: dict[str, Any] = transform(document, {}, _NoManagedPolicies())
    return output


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def role_of(translated: dict[str, Any], logical_id: str) -> dict[str, Any]:
    role = translated["Resources"][logical_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    body: dict[str, Any] = translated["Resources"][role]
    return body


def statements(role: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for policy in role["Properties"].get("Policies", []):
        yield from policy["PolicyDocument"]["Statement"]


def actions(statement: dict[str, Any]) -> set[str]:
    found = statement["Action"]
    return {found} if isinstance(found, str) else set(found)


def alarms() -> dict[str, dict[str, Any]]:
    return {
        k: v["Properties"] for k, v in RESOURCES.items() if v["Type"] == "AWS::CloudWatch::Alarm"
    }


def metrics_read(alarm: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if "MetricName" in alarm:
        yield alarm
    for query in alarm.get("Metrics", []):
        if "MetricStat" in query:
            yield query["MetricStat"]["Metric"]


def test_no_role_gets_sams_account_wide_trigger_policies(translated: dict[str, Any]) -> None:
    roles = {k: v for k, v in translated["Resources"].items() if v["Type"] == "AWS::IAM::Role"}
    assert len(roles) >= len(FUNCTION_IDS)
    for name, role in roles.items():
        for arn in role["Properties"].get("ManagedPolicyArns", []):
            assert not any(policy in str(arn) for policy in ACCOUNT_WIDE), f"{name}: {arn}"


def test_the_reconciler_reads_only_this_tables_stream(translated: dict[str, Any]) -> None:
    granted = [
        s for s in statements(role_of(translated, "ReconcilerFunction")) if actions(s) & STREAM_READ
    ]
    assert granted, "the reconciler's role cannot read the stream"
    # The example table's stream, or the streams of the existing table the stack is given.
    # (or the Global Table's replica in the stack's Region, created by the home Region's stack).
    ours = ({"Fn::GetAtt": ["Table", "StreamArn"]}, {"Fn::Sub": "${Table.Arn}/stream/*"})
    global_ = (
        {"Fn::GetAtt": ["GlobalTable", "StreamArn"]},
        {"Fn::Sub": "${GlobalTable.Arn}/stream/*"},
    )
    for statement in granted:
        condition, created, otherwise = statement["Resource"]["Fn::If"]
        assert condition == "CreateTable" and created in ours, statement
        condition, replica, existing = otherwise["Fn::If"]
        assert condition == "CreateGlobalTable" and replica in global_, statement
        assert existing["Fn::Sub"].endswith(":table/${ExistingTableName}/stream/*"), statement
    # With its own role, the on-failure destination's send is the template's to grant.
    sends = [
        s
        for s in statements(role_of(translated, "ReconcilerFunction"))
        if "sqs:SendMessage" in actions(s)
    ]
    assert [s["Resource"] for s in sends] == [{"Fn::GetAtt": ["StreamFailureQueue", "Arn"]}]


def test_the_recheck_function_receives_only_from_its_queue(translated: dict[str, Any]) -> None:
    granted = [
        s for s in statements(role_of(translated, "RecheckFunction")) if actions(s) & QUEUE_RECEIVE
    ]
    assert granted and all(actions(s) >= QUEUE_RECEIVE for s in granted)
    assert all(s["Resource"] == {"Fn::GetAtt": ["RecheckQueue", "Arn"]} for s in granted), granted


@pytest.mark.parametrize("logical_id", FUNCTION_IDS)
def test_every_function_has_an_error_alarm_of_its_own(logical_id: str) -> None:
    own = [
        name
        for name, alarm in alarms().items()
        if any(
            m["MetricName"] == "Errors"
            and m.get("Dimensions") == [{"Name": "FunctionName", "Value": {"Ref": logical_id}}]
            for m in metrics_read(alarm)
        )
    ]
    assert own, f"no alarm watches {logical_id}'s errors"
    for name in own:
        # Its own alarm: no other function's invocations can dilute its failures.
        functions_read = {
            str(d["Value"]) for m in metrics_read(alarms()[name]) for d in m.get("Dimensions", [])
        }
        assert functions_read == {str({"Ref": logical_id})}, name


def test_a_failed_scheduled_audit_lands_on_a_queue_that_alarms() -> None:
    audit = RESOURCES["AuditFunction"]["Properties"]
    on_failure = audit["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]
    assert on_failure["Type"] == "SQS"
    queue, attribute = on_failure["Destination"]["Fn::GetAtt"]
    assert (RESOURCES[queue]["Type"], attribute) == ("AWS::SQS::Queue", "Arn")
    (schedule,) = [e for e in audit["Events"].values() if e["Type"] == "ScheduleV2"]
    assert schedule["Properties"]["DeadLetterConfig"]["Arn"] == on_failure["Destination"]
    watched = [
        name
        for name, alarm in alarms().items()
        if alarm.get("Namespace") == "AWS/SQS"
        and alarm["Dimensions"][0]["Value"] == {"Fn::GetAtt": [queue, "QueueName"]}
    ]
    assert watched, f"nothing alarms when {queue} holds a message"


def test_a_failed_audit_run_of_the_state_machine_alarms() -> None:
    """The schedule starts the state machine by default: a run it could not start lands on the
    audit failure queue, and a run that failed, timed out or was aborted alarms."""
    machine = RESOURCES["AuditStateMachine"]["Properties"]
    (schedule,) = [e for e in machine["Events"].values() if e["Type"] == "ScheduleV2"]
    dead_letter = schedule["Properties"]["DeadLetterConfig"]["Arn"]
    assert dead_letter == {"Fn::GetAtt": ["AuditFailureQueue", "Arn"]}
    read = {
        m["MetricName"]
        for alarm in alarms().values()
        for m in metrics_read(alarm)
        if m["Namespace"] == "AWS/States"
        and m["Dimensions"] == [{"Name": "StateMachineArn", "Value": {"Ref": "AuditStateMachine"}}]
    }
    assert {"ExecutionsFailed", "ExecutionsTimedOut", "ExecutionsAborted"} <= read


def test_the_writer_api_logs_access_and_throttles() -> None:
    api = RESOURCES["WriterApi"]["Properties"]
    group, attribute = api["AccessLogSettings"]["DestinationArn"]["Fn::GetAtt"]
    assert (RESOURCES[group]["Type"], attribute) == ("AWS::Logs::LogGroup", "Arn")
    assert "RetentionInDays" in RESOURCES[group]["Properties"]
    assert "$context.requestId" in api["AccessLogSettings"]["Format"]
    for setting in ("ThrottlingRateLimit", "ThrottlingBurstLimit"):
        value = api["DefaultRouteSettings"][setting]
        assert set(value) == {"Ref"} and value["Ref"] in TEMPLATE["Parameters"], setting


@pytest.mark.parametrize("logical_id", FUNCTION_IDS)
def test_functions_are_built_from_the_makefile_with_the_layer(logical_id: str) -> None:
    """src/Makefile leaves local mode and the CLI behind; the layer holds the dependencies."""
    assert RESOURCES[logical_id]["Metadata"]["BuildMethod"] == "makefile"
    layers = TEMPLATE["Globals"]["Function"]["Layers"]
    (layer,) = (RESOURCES[ref["Ref"]] for ref in layers)
    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    assert layer["Metadata"]["BuildMethod"] == "makefile"
    assert (
        layer["Properties"]["CompatibleArchitectures"]
        == TEMPLATE["Globals"]["Function"]["Architectures"]
    )
