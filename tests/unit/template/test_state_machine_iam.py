"""The audit state machine's calls, read from its definition, against its role.

Step Functions makes these calls itself (no code of ours runs them, so nothing can record
them; moto does not run service integrations). Each Task's resource is mapped to the IAM
actions AWS documents for that integration, on the resource its parameters name after
substitution; the export and Athena then use the same role for what they read and write
(DynamoDB's export writes the bucket; Athena reads the export, writes its results and keeps
its tables in Glue). Every such call must be allowed, and every grant of the role must be
needed by one of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from tests.harness.iam import EXAMPLE, EXISTING, Deployment, Request, _like

PRINCIPAL = "AuditStateMachine"


def _states(machine: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, state in machine["States"].items():
        yield name, state
        inner = state.get("ItemProcessor") or state.get("Iterator")
        if inner is not None:
            yield from _states(inner)


def calls(deployment: Deployment) -> list[tuple[str, Request]]:
    """(state, request) for every call the definition makes Step Functions (or the export,
    or Athena, on its behalf) make."""
    props = deployment.resources[PRINCIPAL]["Properties"]
    values = {k: str(deployment.resolve(v)) for k, v in props["DefinitionSubstitutions"].items()}
    definition = json.loads(deployment.resolve(props["DefinitionString"]))  # as SAM deploys it

    def fill(text: str) -> str:
        return re.sub(r"\$\{([^}]+)\}", lambda m: values[m[1]], text)

    bucket = deployment.get_att("AuditBucket", "Arn")
    table = fill("${TableArn}")
    workgroup = deployment.arn("workgroup", "AuditWorkGroup")
    database = deployment.ref("AuditDatabase")
    glue = f"arn:aws:glue:{deployment.ref('AWS::Region')}:{deployment.ref('AWS::AccountId')}"
    machine = str(deployment.ref(PRINCIPAL))
    found: list[tuple[str, Request]] = []

    def add(state: str, action: str, resource: str) -> None:
        found.append((state, Request(action, resource)))

    for name, state in _states(definition):
        resource = state.get("Resource", "")
        parameters = state.get("Parameters", {})
        if resource == "arn:aws:states:::lambda:invoke":
            add(name, "lambda:InvokeFunction", fill(parameters["FunctionName"]))
        elif resource == "arn:aws:states:::aws-sdk:dynamodb:describeTable":
            assert fill(parameters["TableName"]) == table.rsplit("/", 1)[-1]
            add(name, "dynamodb:DescribeTable", table)
        elif resource == "arn:aws:states:::aws-sdk:dynamodb:exportTableToPointInTime":
            assert fill(parameters["TableArn"]) == table
            add(name, "dynamodb:ExportTableToPointInTime", table)
            prefix = f"{bucket}/{parameters['S3Prefix']}/"
            # The export writes its files with the caller's permissions.
            for action in ("s3:PutObject", "s3:PutObjectAcl", "s3:AbortMultipartUpload"):
                add(name, action, prefix + "AWSDynamoDB/01234567890123-abcdef01/data/x.json.gz")
        elif resource == "arn:aws:states:::aws-sdk:dynamodb:describeExport":
            add(name, "dynamodb:DescribeExport", f"{table}/export/01234567890123-abcdef01")
        elif resource == "arn:aws:states:::athena:startQueryExecution.sync":
            assert fill(parameters["WorkGroup"]) == str(deployment.ref("AuditWorkGroup"))
            for action in ("StartQueryExecution", "GetQueryExecution", "StopQueryExecution"):
                add(name, f"athena:{action}", workgroup)
            # Athena runs the query as the caller: the catalog and the export's table in
            # Glue, the export's files and the results in the bucket.
            for action in (
                "GetDatabase",
                "GetTable",
                "CreateTable",
                "DeleteTable",
                "GetPartitions",
            ):
                for arn in (
                    f"{glue}:catalog",
                    f"{glue}:database/{database}",
                    f"{glue}:table/{database}/export_01234567890123",
                ):
                    add(name, f"glue:{action}", arn)
            for action in ("GetBucketLocation", "ListBucket", "ListBucketMultipartUploads"):
                add(name, f"s3:{action}", bucket)
            for action in (
                "GetObject",
                "PutObject",
                "AbortMultipartUpload",
                "ListMultipartUploadParts",
            ):
                add(name, f"s3:{action}", f"{bucket}/athena/query-id.csv")
        elif state.get("Type") == "Map" and "ItemReader" in state:
            reader = state["ItemReader"]
            assert reader["Resource"] == "arn:aws:states:::s3:getObject"
            assert fill(reader["Parameters"]["Bucket"]) == str(deployment.ref("AuditBucket"))
            add(name, "s3:GetObject", f"{bucket}/athena/query-id.csv")
            writer = state["ResultWriter"]
            assert writer["Resource"] == "arn:aws:states:::s3:putObject"
            add(
                name, "s3:PutObject", f"{bucket}/{writer['Parameters']['Prefix']}/run/manifest.json"
            )
            add(name, "s3:ListMultipartUploadParts", f"{bucket}/audit-runs/run/SUCCEEDED_0.json")
            add(name, "s3:AbortMultipartUpload", f"{bucket}/audit-runs/run/SUCCEEDED_0.json")
            # A Distributed Map runs child executions of this state machine.
            add(name, "states:StartExecution", machine)
            execution = machine.replace(":stateMachine:", ":execution:")
            for action in ("DescribeExecution", "StopExecution"):
                add(name, f"states:{action}", f"{execution}/map-run-child")
        elif resource:
            pytest.fail(f"{name}: no IAM mapping for {resource}")
    return found


@pytest.fixture(scope="module", params=["example", "existing"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return Deployment(EXAMPLE if request.param == "example" else EXISTING)


def test_every_call_the_definition_makes_is_allowed(deployment: Deployment) -> None:
    policy = deployment.policy(PRINCIPAL)
    refused = [
        f"{state}: {request.action} on {request.resource}: {policy.evaluate(request).why}"
        for state, request in calls(deployment)
        if not policy.evaluate(request).allowed
    ]
    assert refused == []


def test_every_grant_of_the_role_is_needed_by_some_call(deployment: Deployment) -> None:
    requests = [request for _, request in calls(deployment)]
    unused = [
        f"{statement.label}: {action} on {resource}"
        for statement in deployment.policy(PRINCIPAL).statements
        if statement.effect == "Allow" and not statement.managed_by_aws
        for action, resource in statement.grants()
        if not any(
            _like(r.action.lower(), action.lower()) and _like(r.resource, resource)
            for r in requests
        )
    ]
    assert unused == []


@pytest.mark.parametrize("action", ["athena:GetQueryExecution", "glue:CreateTable", "s3:PutObject"])
def test_a_removed_grant_names_the_state_and_action(action: str) -> None:
    deployment = Deployment(EXISTING)
    policy = deployment.policy(PRINCIPAL).without(action)
    refused = [
        (state, request.action)
        for state, request in calls(deployment)
        if not policy.evaluate(request).allowed
    ]
    assert refused and all(a == action for _, a in refused), refused
