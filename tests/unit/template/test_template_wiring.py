"""template.yaml is wired to the code: handlers, environment, stream mapping, guard rails.

No AWS: the template is read as YAML (intrinsics in long form) and the handlers imported.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tally.core.settings import Settings
from tally.local.functions import Function, code_root, environment, function, functions
from tally.local.stack_record import LocalStack, sam_env
from tally.local.state import SAM_ENV_FILE, STATE_DIR_NAME
from tally.local.template import load_template, template_path
from tally.rules import (
    REPAIR_MARKER,
    RuleSet,
    load_rules,
)
from tally.rules.stream_filter import filter_json

TEMPLATE = load_template(template_path())
FUNCTIONS = functions(TEMPLATE)
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]

# What every function that builds a Reconciler needs, named so a refactor cannot drop them.
RECONCILER_VARIABLES = {
    "TABLE_NAME",
    "RULES_FILE",
    "AUDIT_TABLE_NAME",
    "ALERT_TOPIC_ARN",
    "RECHECK_QUEUE_URL",
}
RECONCILING_FUNCTIONS = ("ReconcilerFunction", "RecheckFunction", "AuditFunction")


def by_type(kind: str) -> dict[str, dict[str, Any]]:
    return {name: body for name, body in RESOURCES.items() if body.get("Type") == kind}


def local_names() -> dict[str, str]:
    """Stand-in names for every resource the environment may refer to."""
    return {name: f"tally-local-{name.lower()}" for name in RESOURCES}


def ids(spec: Function) -> str:
    return spec.logical_id


# --- which Settings the code a function runs reads ------------------------------------------


def _imported(module: str, tree: ast.Module) -> Iterator[str]:
    """The tally modules (and their parent packages) one module imports."""
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                package = module.rsplit(".", node.level)[0]
                base = f"{package}.{node.module}"
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for name in names:
            parts = name.split(".")
            if parts[0] != "tally":
                continue
            for end in range(1, len(parts) + 1):
                yield ".".join(parts[:end])


def code_of(module: str) -> dict[str, str]:
    """Source of every tally module ``module`` loads, directly or not (static imports)."""
    sources: dict[str, str] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        if name in sources:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            spec = None
        if spec is None or spec.origin is None:
            continue  # an attribute imported from a package, not a module
        source = Path(spec.origin).read_text(encoding="utf-8")
        sources[name] = source
        pending.extend(_imported(name, ast.parse(source)))
    return sources


# Lambda's reserved variables: it sets them, a template may not.
LAMBDA_SETS = {"AWS_REGION"}


def settings_read(handler: str) -> set[str]:
    """Environment variables (Settings aliases) read by the modules behind ``handler``."""
    module = handler.rpartition(".")[0]
    readers = [
        source
        for name, source in code_of(module).items()
        if name != "tally.core.settings" and re.search(r"from tally\.core\.settings import", source)
    ]
    read = set()
    for field, info in Settings.model_fields.items():
        used = re.compile(rf"\.{field}\b|[\"']{field}[\"']")
        if any(used.search(source) for source in readers):
            assert info.alias is not None, f"Settings.{field} has no environment alias"
            read.add(info.alias)
    return read


# --- functions: handlers and environment ----------------------------------------------------


@pytest.mark.parametrize("spec", FUNCTIONS, ids=ids)
def test_handler_imports(spec: Function) -> None:
    assert callable(spec.load())


@pytest.mark.parametrize("spec", FUNCTIONS, ids=ids)
def test_environment_sets_every_setting_the_code_reads(spec: Function) -> None:
    read = settings_read(spec.handler)
    assert read, f"{spec.handler}: found no Settings read; the derivation is broken"
    missing = read - set(spec.environment) - LAMBDA_SETS
    assert not missing, f"{spec.logical_id} runs code reading {sorted(missing)}, not set"


@pytest.mark.parametrize("logical_id", RECONCILING_FUNCTIONS)
def test_reconciling_functions_read_and_get_the_reconciler_settings(logical_id: str) -> None:
    spec = function(TEMPLATE, logical_id)
    assert settings_read(spec.handler) >= RECONCILER_VARIABLES
    assert set(spec.environment) >= RECONCILER_VARIABLES


@pytest.mark.parametrize("spec", FUNCTIONS, ids=ids)
def test_environment_defaults_validate_as_settings(spec: Function) -> None:
    """Parameter defaults (REPAIR_BUDGET, DRY_RUN, ...) parse the way the code reads them."""
    values = environment(TEMPLATE, spec.logical_id, local_names())
    settings = Settings.model_validate(values)
    assert settings.repair_budget >= 0
    assert (Path(values["LAMBDA_TASK_ROOT"]) / values["RULES_FILE"]).is_file()


def test_powertools_is_configured_for_every_function() -> None:
    variables = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    for name in ("POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_LOG_LEVEL"):
        assert variables.get(name), f"Globals set no {name}"


def test_globals_pin_the_runtime() -> None:
    defaults = TEMPLATE["Globals"]["Function"]
    assert re.fullmatch(r"python3\.(1[1-9]|[2-9]\d)", defaults["Runtime"])
    assert defaults["Architectures"] == ["arm64"]
    assert defaults["Tracing"] == "Active"
    assert isinstance(defaults["Timeout"], int) and defaults["Timeout"] > 0
    assert isinstance(defaults["MemorySize"], int) and defaults["MemorySize"] >= 128


# --- the stream event source mapping --------------------------------------------------------


def stream_event() -> dict[str, Any]:
    spec = function(TEMPLATE, "ReconcilerFunction")
    streams = [e for e in spec.events.values() if e.get("Type") == "DynamoDB"]
    assert len(streams) == 1
    properties: dict[str, Any] = streams[0]["Properties"]
    return properties


def test_stream_mapping_retries_finitely_and_reports_failed_records() -> None:
    stream = stream_event()
    assert stream["Stream"] == {
        "Fn::If": [
            "CreateTable",
            {"Fn::GetAtt": ["Table", "StreamArn"]},
            {
                "Fn::If": [
                    "CreateGlobalTable",
                    {"Fn::GetAtt": ["GlobalTable", "StreamArn"]},
                    {"Ref": "ExistingTableStreamArn"},
                ]
            },
        ]
    }
    assert stream["BisectBatchOnFunctionError"] is True
    # -1 means forever: a poisoned record would block its shard for the stream's lifetime.
    retries, age = stream["MaximumRetryAttempts"], stream["MaximumRecordAgeInSeconds"]
    assert isinstance(retries, int) and 0 <= retries <= 10_000
    assert isinstance(age, int) and 60 <= age <= 604_800
    assert stream["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    on_failure = stream["DestinationConfig"]["OnFailure"]
    assert on_failure["Type"] == "SQS"
    queue, attribute = on_failure["Destination"]["Fn::GetAtt"]
    assert (RESOURCES[queue]["Type"], attribute) == ("AWS::SQS::Queue", "Arn")


@pytest.mark.parametrize("setting", ["StartingPosition", "ParallelizationFactor"])
def test_stream_mapping_setting_is_a_parameter(setting: str) -> None:
    value = stream_event()[setting]
    assert set(value) == {"Ref"}, f"{setting} is hard-coded: {value!r}"
    assert value["Ref"] in TEMPLATE["Parameters"]


def test_recheck_queue_feeds_partial_batch_responses_and_outlives_the_function() -> None:
    spec = function(TEMPLATE, "RecheckFunction")
    (event,) = (e for e in spec.events.values() if e.get("Type") == "SQS")
    assert event["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    queue = event["Properties"]["Queue"]["Fn::GetAtt"][0]
    # AWS's advice for SQS event sources: visibility at least six times the function timeout.
    assert RESOURCES[queue]["Properties"]["VisibilityTimeout"] >= 6 * spec.timeout


# --- the stream filter is the one the bundled rules produce ----------------------------------


def bundled_rules() -> RuleSet:
    """The rules file the template bundles, found the way Lambda finds it."""
    spec = function(TEMPLATE, "ReconcilerFunction")
    return load_rules(code_root(TEMPLATE, "ReconcilerFunction") / spec.environment["RULES_FILE"])


def test_stream_filter_is_the_parameter_that_defaults_to_the_bundled_rules_filter() -> None:
    assert stream_event()["FilterCriteria"] == {
        "Filters": [{"Pattern": {"Ref": "StreamFilterPattern"}}]
    }
    default = TEMPLATE["Parameters"]["StreamFilterPattern"]["Default"]
    assert default == filter_json(bundled_rules())
    # Lambda's limit on one filter pattern, and CloudFormation's on a String parameter.
    assert len(default) <= 4096


# --- guard rails ----------------------------------------------------------------------------


def test_every_log_group_expires_and_every_function_uses_one() -> None:
    groups = by_type("AWS::Logs::LogGroup")
    assert groups
    for name, body in groups.items():
        assert "RetentionInDays" in body["Properties"], f"{name} keeps logs forever"
    for spec in FUNCTIONS:
        props = RESOURCES[spec.logical_id]["Properties"]
        group = props.get("LoggingConfig", {}).get("LogGroup", {}).get("Ref")
        assert group in groups, f"{spec.logical_id} logs to a group with no retention"


def test_every_alarm_notifies_the_alert_topic() -> None:
    alarms = by_type("AWS::CloudWatch::Alarm")
    assert alarms
    for name, body in alarms.items():
        props = body["Properties"]
        assert props.get("TreatMissingData") == "notBreaching", name
        assert {"Ref": "AlertTopic"} in props.get("AlarmActions", []), name


def test_tables_are_retained_recoverable_and_encrypted() -> None:
    tables = by_type("AWS::DynamoDB::Table")
    assert {"Table", "AuditTable"} <= set(tables)
    for name, body in tables.items():
        assert body.get("DeletionPolicy") == "Retain", name
        assert body.get("UpdateReplacePolicy") == "Retain", name
        props = body["Properties"]
        assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
        assert props["SSESpecification"]["SSEEnabled"] is True


def statements(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every IAM statement under ``node`` (policy documents, SAM inline policies, key policies)."""
    if isinstance(node, Mapping):
        found = node.get("Statement")
        if isinstance(found, list):
            for statement in found:
                yield where, statement
        for key, value in node.items():
            yield from statements(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from statements(value, f"{where}[{index}]")


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_no_wildcard_actions_or_resources_outside_the_key_policy() -> None:
    checked = 0
    for name, body in RESOURCES.items():
        # In a KMS key policy, Resource "*" means this key, and only the key policy applies.
        key_policy = body.get("Type") == "AWS::KMS::Key"
        for where, statement in statements(body.get("Properties", {}), name):
            if key_policy and ".KeyPolicy" in where:
                continue
            checked += 1
            for action in as_list(statement.get("Action", [])):
                assert action != "*" and not str(action).endswith(":*"), f"{where}: {action}"
            for resource in as_list(statement.get("Resource", [])):
                assert resource != "*", f"{where}: Resource '*'"
            assert statement.get("Principal") not in ("*", {"AWS": "*"}), f"{where}: anyone"
            assert "NotAction" not in statement and "NotResource" not in statement, where
    assert checked >= 3, "found too few statements: the walk is broken"


# --- `sam local invoke` variables: what `tally local up` writes, where samconfig reads ------


def fake_stack(state_dir: Path) -> LocalStack:
    return LocalStack(
        started_at="2025-01-15T09:50:00+00:00",
        dynamodb_endpoint="http://127.0.0.1:8001",
        dynamodb_pid=1,
        dynamodb_port=8001,
        moto_endpoint="http://127.0.0.1:5001",
        moto_pid=2,
        moto_port=5001,
        table_name="tally-local-table",
        table_stream_arn="arn:aws:dynamodb:us-east-1:000000000000:table/t/stream/1",
        audit_table_name="tally-local-audit",
        alert_topic_arn="arn:aws:sns:us-east-1:123456789012:tally-local-alerts",
        alert_inbox_url="http://127.0.0.1:5001/123456789012/tally-local-alert-inbox",
        alert_subscription_arn="arn:aws:sns:us-east-1:123456789012:tally-local-alerts:1",
        recheck_queue_url="http://127.0.0.1:5001/123456789012/tally-local-rechecks",
        recheck_dead_letter_queue_url="http://127.0.0.1:5001/123456789012/dl",
        stream_failure_queue_url="http://127.0.0.1:5001/123456789012/failures",
        state_dir=state_dir,
        repair_switches_parameter="/tally/tally-local/repair-switches",
    )


def test_sam_env_sets_each_function_s_resource_names_and_only_declared_variables(
    tmp_path: Path,
) -> None:
    env = sam_env(fake_stack(tmp_path))
    assert set(env) == {spec.logical_id for spec in FUNCTIONS}
    for spec in FUNCTIONS:
        values = env[spec.logical_id]
        # sam local invoke silently ignores variables the template does not declare.
        undeclared = set(values) - set(spec.environment)
        assert not undeclared, f"{spec.logical_id}: {sorted(undeclared)} would be ignored"
        refs = {
            name
            for name, value in spec.environment.items()
            if isinstance(value, dict) and value.get("Ref") in RESOURCES
        }
        assert refs <= set(values), f"{spec.logical_id}: resource names unset: {refs - set(values)}"
        # The container reaches the stack through the declared-empty endpoint variables.
        assert values["DYNAMODB_ENDPOINT"] == "http://127.0.0.1:8001"
        assert values["SQS_ENDPOINT"] == values["SNS_ENDPOINT"] == "http://127.0.0.1:5001"
        assert all(isinstance(v, str) and v for v in values.values())
        assert Settings.model_validate(values).table_name == values["TABLE_NAME"]


def test_samconfig_local_invoke_reads_what_local_up_writes() -> None:
    config = tomllib.loads((template_path().parent / "samconfig.toml").read_text())
    local_invoke = config["default"]["local_invoke"]["parameters"]
    assert Path(local_invoke["env_vars"]) == Path(STATE_DIR_NAME) / SAM_ENV_FILE
    # The local stack listens on the host's loopback, which only the host network reaches.
    assert local_invoke["docker_network"] == "host"


def overrides(section: Mapping[str, Any]) -> dict[str, str]:
    """A samconfig deploy section's ``parameter_overrides`` as name -> value."""
    pairs = (token.partition("=") for token in shlex.split(section["parameter_overrides"]))
    return {name: value for name, _, value in pairs}


@pytest.mark.parametrize("env", ["default", "prod"])
def test_every_samconfig_override_is_a_value_the_template_accepts(env: str) -> None:
    """`sam deploy --config-env ENV` must not fail the template's parameter validation."""
    config = tomllib.loads((template_path().parent / "samconfig.toml").read_text())
    parameters = TEMPLATE["Parameters"]
    for name, value in overrides(config[env]["deploy"]["parameters"]).items():
        assert name in parameters, f"{env}: {name} is no parameter of template.yaml"
        spec = parameters[name]
        if "AllowedValues" in spec:
            allowed = [str(v) for v in spec["AllowedValues"]]
            assert value in allowed, f"{env}: {name}={value!r}, allowed {allowed}"
        if spec["Type"] == "Number":
            number = float(value)
            assert number >= spec.get("MinValue", number), f"{env}: {name}={value} too small"
            assert number <= spec.get("MaxValue", number), f"{env}: {name}={value} too large"


def test_the_writer_function_may_not_write_the_repair_marker() -> None:
    policies = TEMPLATE["Resources"]["WriterFunction"]["Properties"]["Policies"]
    denied = [
        statement
        for policy in policies
        for statement in policy.get("Statement", [])
        if statement["Effect"] == "Deny"
    ]
    [deny] = denied
    assert {"dynamodb:PutItem", "dynamodb:UpdateItem"} <= set(deny["Action"])
    condition = deny["Condition"]["ForAnyValue:StringEquals"]["dynamodb:Attributes"]
    assert REPAIR_MARKER in condition
