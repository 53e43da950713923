"""template.yaml's export engine: the bucket, the workgroup, and a state machine wired to the code.

No AWS: the template is read as YAML (intrinsics in long form) and walked.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tally.audit.athena_plan import AthenaPlan
from tally.audit.report import AuditReport
from tally.local.functions import functions
from tally.local.template import load_template, template_path

TEMPLATE = load_template(template_path())
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
MACHINE = RESOURCES["AuditStateMachine"]["Properties"]
STATES: dict[str, Any] = MACHINE["Definition"]["States"]


def test_the_bucket_is_private_encrypted_and_expires_what_it_holds() -> None:
    bucket = RESOURCES["AuditBucket"]["Properties"]
    (encryption,) = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert encryption["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    assert all(bucket["PublicAccessBlockConfiguration"].values())
    assert len(bucket["PublicAccessBlockConfiguration"]) == 4
    (rule,) = bucket["LifecycleConfiguration"]["Rules"]
    assert rule["Status"] == "Enabled"
    assert rule["ExpirationInDays"] == {"Ref": "AuditExportRetentionDays"}
    assert rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] >= 1


def test_the_workgroup_limits_each_query_and_keeps_results_in_the_bucket() -> None:
    config = RESOURCES["AuditWorkGroup"]["Properties"]["WorkGroupConfiguration"]
    assert config["BytesScannedCutoffPerQuery"] == {"Ref": "AuditQueryScanLimitBytes"}
    assert TEMPLATE["Parameters"]["AuditQueryScanLimitBytes"]["MinValue"] >= 10_000_000
    assert config["EnforceWorkGroupConfiguration"] is True
    results = config["ResultConfiguration"]
    assert results["OutputLocation"] == {"Fn::Sub": "s3://${AuditBucket}/athena/"}
    assert results["EncryptionConfiguration"]["EncryptionOption"] == "SSE_S3"


def transitions(states: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for name, state in states.items():
        targets = [state.get("Next"), state.get("Default")]
        targets += [choice["Next"] for choice in state.get("Choices", [])]
        targets += [catch["Next"] for catch in state.get("Catch", [])]
        for target in targets:
            if target:
                yield name, target


def test_every_state_is_reached_and_every_transition_lands() -> None:
    reached = {MACHINE["Definition"]["StartAt"]} | {t for _, t in transitions(STATES)}
    assert set(STATES) == reached
    assert all(target in STATES for _, target in transitions(STATES))


def test_the_engine_is_chosen_by_the_parameter_or_by_item_count() -> None:
    choose = STATES[MACHINE["Definition"]["StartAt"]]
    assert {c["StringEquals"]: c["Next"] for c in choose["Choices"]} == {
        "scan": "Scan",
        "export": "Export",
    }
    count = STATES[choose["Default"]]
    assert count["Resource"] == "arn:aws:states:::aws-sdk:dynamodb:describeTable"
    (large,) = STATES[count["Next"]]["Choices"]
    assert large["NumericGreaterThanEqualsPath"] == "$.exportFromItems"
    assert (large["Next"], STATES[count["Next"]]["Default"]) == ("Export", "Scan")
    assert MACHINE["DefinitionSubstitutions"]["AuditFunction"] == {
        "Fn::GetAtt": ["AuditFunction", "Arn"]
    }
    assert TEMPLATE["Parameters"]["AuditEngine"]["AllowedValues"] == ["auto", "scan", "export"]


def test_one_schedule_runs_the_audit_whatever_the_engine() -> None:
    machine = MACHINE["Events"]["Schedule"]["Properties"]
    (function,) = (
        e["Properties"]
        for e in RESOURCES["AuditFunction"]["Properties"]["Events"].values()
        if e["Type"] == "ScheduleV2"
    )
    assert machine["ScheduleExpression"] == function["ScheduleExpression"]
    assert function["ScheduleExpression"] == {"Ref": "AuditSchedule"}
    # Exactly one of the two is enabled: the function alone when the engine is scan; neither
    # outside a Global Table's home Region.
    assert function["State"] == {
        "Fn::If": ["AuditsHere", {"Fn::If": ["AuditScansOnly", "ENABLED", "DISABLED"]}, "DISABLED"]
    }
    assert machine["State"] == {
        "Fn::If": ["AuditsHere", {"Fn::If": ["AuditScansOnly", "DISABLED", "ENABLED"]}, "DISABLED"]
    }
    assert TEMPLATE["Conditions"]["AuditScansOnly"] == {
        "Fn::Equals": [{"Ref": "AuditEngine"}, "scan"]
    }
    assert machine["Input"]["Fn::Sub"] == (
        '{"engine": "${AuditEngine}", "exportFromItems": ${AuditExportThreshold}}'
    )


def test_a_full_export_in_dynamodb_json_is_awaited_before_the_query() -> None:
    export = STATES["Export"]
    assert export["Resource"] == "arn:aws:states:::aws-sdk:dynamodb:exportTableToPointInTime"
    assert export["Parameters"]["ExportType"] == "FULL_EXPORT"
    assert export["Parameters"]["ExportFormat"] == "DYNAMODB_JSON"
    assert export["Parameters"]["S3Bucket"] == "${Bucket}"
    assert MACHINE["DefinitionSubstitutions"]["Bucket"] == {"Ref": "AuditBucket"}
    # The table the export reads has point-in-time recovery, which exports need.
    pitr = RESOURCES["Table"]["Properties"]["PointInTimeRecoverySpecification"]
    assert pitr["PointInTimeRecoveryEnabled"] is True
    done = STATES[STATES[STATES[export["Next"]]["Next"]]["Next"]]
    assert {c["StringEquals"]: c["Next"] for c in done["Choices"]} == {
        "COMPLETED": "PlanQuery",
        "IN_PROGRESS": "WaitForExport",
    }


def test_the_plan_s_fields_and_the_report_s_fields_are_the_ones_the_machine_reads() -> None:
    plan = STATES["PlanQuery"]
    assert plan["Parameters"]["FunctionName"] == "${AuditQueryFunction}"
    fields = {f.name for f in dataclasses.fields(AthenaPlan)}
    for path in plan["ResultSelector"].values():
        assert path.removeprefix("$.Payload.") in fields
    for name in ("CreateTable", "Query", "DropTable", "DropTableAfterFailure"):
        state = STATES[name]
        assert state["Resource"] == "arn:aws:states:::athena:startQueryExecution.sync"
        assert state["Parameters"]["WorkGroup"] == "${WorkGroup}"
        assert state["Parameters"]["QueryString.$"].removeprefix("$.plan.") in fields
    check = STATES["Candidates"]["ItemProcessor"]["States"]["Check"]
    report = AuditReport(["likes"]).as_json()
    for path in check["ResultSelector"].values():
        assert path.removeprefix("$.Payload.") in report


def test_candidates_are_read_from_the_query_s_csv_in_a_distributed_map() -> None:
    candidates = STATES["Candidates"]
    assert candidates["ItemProcessor"]["ProcessorConfig"]["Mode"] == "DISTRIBUTED"
    reader = candidates["ItemReader"]
    assert reader["ReaderConfig"] == {"InputType": "CSV", "CSVHeaderLocation": "FIRST_ROW"}
    # Athena writes <OutputLocation><QueryExecutionId>.csv: the workgroup's athena/ prefix.
    assert reader["Parameters"]["Key.$"] == "States.Format('athena/{}.csv', $.query.id)"
    assert STATES["Query"]["ResultSelector"]["id.$"] == "$.QueryExecution.QueryExecutionId"
    assert candidates["MaxConcurrency"] >= 1 and candidates["ItemBatcher"]["MaxItemsPerBatch"] > 0
    check = candidates["ItemProcessor"]["States"]["Check"]
    assert check["Parameters"]["FunctionName"] == "${AuditCandidatesFunction}"
    # A failed query or batch still drops the export's table.
    for name in ("Query", "Candidates"):
        (catch,) = STATES[name]["Catch"]
        assert catch["Next"] == "DropTableAfterFailure"


def test_the_machine_may_invoke_every_function_it_names() -> None:
    named = {
        value["Fn::GetAtt"][0]
        for value in MACHINE["DefinitionSubstitutions"].values()
        if isinstance(value, dict)
        and "Fn::GetAtt" in value
        and value["Fn::GetAtt"][1] == "Arn"
        and RESOURCES[value["Fn::GetAtt"][0]]["Type"] == "AWS::Serverless::Function"
    }
    invokable = {
        p["LambdaInvokePolicy"]["FunctionName"]["Ref"]
        for p in MACHINE["Policies"]
        if isinstance(p, dict) and "LambdaInvokePolicy" in p
    }
    assert named == invokable == {"AuditFunction", "AuditQueryFunction", "AuditCandidatesFunction"}


def _imports(module: str) -> Iterator[str]:
    """Every module ``module`` imports statically, and theirs, within tally."""
    seen: set[str] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for found in names:
                yield found
                if found.startswith("tally"):
                    pending.append(found)


@pytest.mark.parametrize("spec", functions(TEMPLATE), ids=lambda spec: spec.logical_id)
def test_no_function_needs_duckdb_or_the_local_tools(spec: Any) -> None:
    imported = set(_imports(spec.handler.rpartition(".")[0]))
    assert not {name for name in imported if name.split(".")[0] == "duckdb"}
    assert not {name for name in imported if name.startswith("tally.local")}
    requirements = (template_path().parent / "layer" / "requirements.txt").read_text()
    assert "duckdb" not in requirements.lower()
