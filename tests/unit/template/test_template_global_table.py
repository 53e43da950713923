"""template.yaml on a Global Table, as `sam deploy` expands it and CloudFormation would resolve it
in the stack's Region (us-east-1): once as the home Region's stack, which creates the table
with a replica in every Region, once as another Region's, which reconciles the replica there.

moto's CloudFormation does not create ``AWS::DynamoDB::GlobalTable`` (tests/integration/
test_deploy.py deploys the other Regions' layout, which needs no such resource), so the home
Region's layout is proven here, on the template itself.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.settings import Settings
from tally.local.template import load_template, template_path
from tests.harness.cfn_rules import refused
from tests.harness.iam import ACCOUNT, REGION, Deployment

TEMPLATE = load_template(template_path())
REGIONS = "us-east-1,eu-west-1,ap-southeast-2"
HOME = {"GlobalRegions": REGIONS, "HomeRegion": REGION}
REPLICA_STREAM = (
    f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/tally-counters/stream/2026-11-28T00:00:00.000"
)
REPLICA = {
    "GlobalRegions": "eu-west-1,us-east-1",
    "HomeRegion": "eu-west-1",
    "ExistingTableName": "tally-counters",
    "ExistingTableStreamArn": REPLICA_STREAM,
}
# The properties a replica shares with the single-Region table, and so must declare alike.
SHARED = (
    "BillingMode",
    "AttributeDefinitions",
    "KeySchema",
    "GlobalSecondaryIndexes",
    "StreamSpecification",
    "TimeToLiveSpecification",
    "SSESpecification",
)


@pytest.fixture(scope="module")
def home() -> Deployment:
    return Deployment(HOME)


@pytest.fixture(scope="module")
def replica() -> Deployment:
    return Deployment(REPLICA)


def of_type(deployment: Deployment, kind: str) -> dict[str, dict[str, Any]]:
    return {n: b for n, b in deployment.resources.items() if b["Type"] == kind}


def stream_mapping(deployment: Deployment) -> dict[str, Any]:
    [mapping] = [
        m["Properties"]
        for m in of_type(deployment, "AWS::Lambda::EventSourceMapping").values()
        if "StartingPosition" in m["Properties"]
    ]
    return mapping


def schedules(deployment: Deployment, of: str = "Audit") -> list[str]:
    """The states of the schedules of the full audit (its two engines), or of ``of``."""
    return [
        deployment.resolve(s["Properties"]["State"])
        for name, s in of_type(deployment, "AWS::Scheduler::Schedule").items()
        if name.startswith(of)
    ]


def test_the_home_region_creates_the_global_table_with_a_replica_in_every_region(
    home: Deployment,
) -> None:
    assert set(of_type(home, "AWS::DynamoDB::Table")) == {"AuditTable"}
    [table] = of_type(home, "AWS::DynamoDB::GlobalTable").values()
    properties = home.resolve(table["Properties"])
    replicas = [r for r in properties["Replicas"] if r is not None]  # AWS::NoValue drops one
    assert [r["Region"] for r in replicas] == REGIONS.split(",")
    assert all(
        r["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] for r in replicas
    )
    # GlobalTable takes the stream at its top level, for every replica.
    assert properties["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
    regional = TEMPLATE["Resources"]["Table"]["Properties"]
    assert {k: table["Properties"][k] for k in SHARED} == {k: regional[k] for k in SHARED}
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"


def test_two_regions_make_two_replicas() -> None:
    deployment = Deployment({"GlobalRegions": "eu-west-1,us-east-1", "HomeRegion": REGION})
    [table] = of_type(deployment, "AWS::DynamoDB::GlobalTable").values()
    replicas = deployment.resolve(table["Properties"]["Replicas"])
    assert [r["Region"] for r in replicas if r is not None] == ["eu-west-1", "us-east-1"]


def test_the_home_region_reads_its_own_replica_s_stream(home: Deployment) -> None:
    name = home.ref("GlobalTable")
    stream = home.resolve(stream_mapping(home)["EventSourceArn"])
    assert stream.startswith(f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}/stream/")
    assert stream == home.get_att("GlobalTable", "StreamArn")


def test_another_region_reconciles_its_replica_and_creates_no_table(replica: Deployment) -> None:
    assert set(of_type(replica, "AWS::DynamoDB::Table")) == {"AuditTable"}
    assert not of_type(replica, "AWS::DynamoDB::GlobalTable")
    assert replica.resolve(stream_mapping(replica)["EventSourceArn"]) == REPLICA_STREAM


@pytest.mark.parametrize(
    ("parameters", "table"),
    [(HOME, None), (REPLICA, "tally-counters")],
    ids=["home", "replica"],
)
def test_every_function_knows_the_regions_the_home_and_the_table(
    parameters: dict[str, str], table: str | None
) -> None:
    deployment = Deployment(parameters)
    functions = of_type(deployment, "AWS::Lambda::Function")
    assert len(functions) == 7  # the six of every stack, and the heartbeat
    for function in functions.values():
        variables = deployment.resolve(function["Properties"]["Environment"]["Variables"])
        assert variables["GLOBAL_REGIONS"] == parameters["GlobalRegions"]
        assert variables["HOME_REGION"] == parameters["HomeRegion"]
        assert variables["TABLE_NAME"] == (table or deployment.ref("GlobalTable"))


def test_the_full_audit_is_scheduled_in_the_home_region_only(
    home: Deployment, replica: Deployment
) -> None:
    assert sorted(schedules(home)) == ["DISABLED", "ENABLED"]
    assert schedules(replica) == ["DISABLED", "DISABLED"]
    assert sorted(schedules(Deployment({}))) == ["DISABLED", "ENABLED"]


def test_every_region_beats_once_a_minute_and_a_single_region_stack_not_at_all(
    home: Deployment, replica: Deployment
) -> None:
    for deployment in (home, replica):
        assert schedules(deployment, "HeartbeatFunction") == ["ENABLED"]
        [beat] = [
            s["Properties"]
            for name, s in of_type(deployment, "AWS::Scheduler::Schedule").items()
            if name.startswith("HeartbeatFunction")
        ]
        assert beat["ScheduleExpression"] == "rate(1 minute)"
        functions = of_type(deployment, "AWS::Lambda::Function")
        heart = deployment.resolve(functions["HeartbeatFunction"]["Properties"])
        assert heart["Environment"]["Variables"]["HEARTBEAT_SECONDS"] == "60"
    single = Deployment({})
    assert schedules(single, "HeartbeatFunction") == []
    assert "HeartbeatFunction" not in of_type(single, "AWS::Lambda::Function")
    # On MRSC nothing lags: no heartbeat (nor its log group and alarm).
    strong = Deployment(REPLICA | {"GlobalConsistency": "strong", "HomeRegion": REGION})
    assert not {"HeartbeatFunction", "HeartbeatLogGroup", "HeartbeatErrorsAlarm"} & set(
        strong.resources
    )


def test_a_single_region_stack_is_unchanged() -> None:
    deployment = Deployment({})
    assert set(of_type(deployment, "AWS::DynamoDB::Table")) == {"Table", "AuditTable"}
    assert not of_type(deployment, "AWS::DynamoDB::GlobalTable")
    stream = deployment.resolve(stream_mapping(deployment)["EventSourceArn"])
    assert stream == deployment.get_att("Table", "StreamArn")
    for function in of_type(deployment, "AWS::Lambda::Function").values():
        variables = deployment.resolve(function["Properties"]["Environment"]["Variables"])
        assert variables["GLOBAL_REGIONS"] == variables["HOME_REGION"] == ""


# --- what a deploy refuses ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "region", "says"),
    [
        (
            {"GlobalRegions": "us-east-1,eu-west-1", "HomeRegion": "ap-south-1"},
            REGION,
            "HomeRegion",
        ),
        ({"GlobalRegions": "us-east-1,eu-west-1"}, REGION, "HomeRegion is required"),
        (
            {"GlobalRegions": "us-east-1,eu-west-1", "HomeRegion": REGION},
            "sa-east-1",
            "stack's Region",
        ),
        ({"GlobalRegions": "us-east-1,eu-west-1", "HomeRegion": REGION}, "eu-west-1", "replica"),
        ({"GlobalRegions": "us-east-1,,eu-west-1", "HomeRegion": REGION}, REGION, "none of them"),
        ({**HOME, "GlobalConsistency": "strong"}, REGION, "adopts an existing MRSC"),
        ({"GlobalConsistency": "strong"}, REGION, "goes with GlobalRegions"),
    ],
    ids=[
        "home outside",
        "no home",
        "stack outside",
        "replica unnamed",
        "empty Region",
        "strong created",
        "strong alone",
    ],
)
def test_a_deploy_refuses_regions_that_do_not_fit(
    parameters: dict[str, str], region: str, says: str
) -> None:
    failed = refused(TEMPLATE, parameters, region)
    assert any(says in message for message in failed), failed


def test_the_two_layouts_and_a_single_region_table_pass_the_rules() -> None:
    assert refused(TEMPLATE, {**REPLICA, "GlobalConsistency": "strong"}, REGION) == []
    assert refused(TEMPLATE, HOME, REGION) == []
    assert refused(TEMPLATE, REPLICA, REGION) == []
    assert refused(TEMPLATE, {}, REGION) == []


NAMES = st.sampled_from(["us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-south-1"])


@given(
    regions=st.lists(NAMES, min_size=2, max_size=5, unique=True),
    home=NAMES,
    region=NAMES,
    existing=st.booleans(),
)
def test_what_the_rules_let_through_the_functions_accept_at_cold_start(
    regions: list[str], home: str, region: str, existing: bool
) -> None:
    parameters = {"GlobalRegions": ",".join(regions), "HomeRegion": home}
    if existing:
        parameters |= {"ExistingTableName": "t", "ExistingTableStreamArn": REPLICA_STREAM}
    passes = not refused(TEMPLATE, parameters, region)
    assert passes == (home in regions and region in regions and (region == home or existing))
    if passes:
        Settings.model_validate(
            {
                "TABLE_NAME": "tally-counters",
                "GLOBAL_REGIONS": ",".join(regions),
                "AWS_REGION": region,
                "HOME_REGION": home,
            }
        )
