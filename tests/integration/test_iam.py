"""IAM proven by evidence: the AWS calls each function's code makes, recorded while it runs
(tests/harness/iam_calls.py), against that function's policy in template.yaml as `sam deploy`
expands it (tests/harness/iam.py), on the example table and on an existing one.

Driven here, compactly: the bundled rules through every function (writer API routes and
strategies, the stream and recheck handlers with a repair and alerts through the outbox, the
scan audit, and the export audit's candidates from a DuckDB query over a local export); and
each example under examples/adopting/ (every rules layout: collection, index, partition;
count, sum, sequence) adopted on the local stack, through the pump and the audit functions.

The bundled rules run on the template's own table, so their calls are checked on both
deployments; an example runs on its own table (other key names, other indexes), which is
deployed with ExistingTableName, so its calls are checked on that deployment.

Each scenario fails when one of its calls would be refused, naming the function, the action,
the ARN and where in src/tally the call is made. The last tests check the other way round:
every grant is used by some recorded call, or ``NOT_CALLED`` says why it stays.

With TALLY_RECORD_CALLS=PATH the calls are also written there, one JSON object a line.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tally.audit.sql import AuditQuery
from tally.core.regions import CHILD_ID, ORIGIN
from tally.core.settings import settings
from tally.handlers import audit as audit_handler
from tally.handlers import audit_candidates as candidates_handler
from tally.handlers import heartbeat, writer_api
from tally.local import examples, runner
from tally.local.audit_duckdb import query_rows
from tally.local.exports import export_files, write_export
from tally.local.template import load_template, template_path
from tally.reconciler import runtime
from tally.rules import RuleSet
from tests.harness import seeds
from tests.harness.adopting import EXAMPLES, Adopted
from tests.harness.http import invoke
from tests.harness.iam import (
    EXAMPLE,
    EXISTING,
    GLOBAL_HOME,
    GLOBAL_REPLICA,
    Deployment,
    denials,
    grants,
    request_of,
    unexercised,
    without_action,
)
from tests.harness.iam_calls import Call, Recorder, acting_as, environment_roles
from tests.utils import lambda_context, serialize

CODE_FUNCTIONS = (
    "ReconcilerFunction",
    "RecheckFunction",
    "AuditFunction",
    "AuditCandidatesFunction",
    "AuditQueryFunction",
    "WriterFunction",
    "HeartbeatFunction",  # a Global Table's stacks only
)
SHAPES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "rules.toml").is_file())
# Grants no code path calls, and why each stays. Keys: "<statement label>" (all its actions)
# or "<statement label> <action>".
NOT_CALLED = {
    "ReconcilerRole/stream-and-logs#ReadThisStream": (
        "Lambda's event source mapping reads the stream with the function's role; the code "
        "is handed the records"
    ),
    "ReconcilerRole/stream-and-logs#ListThisTablesStreams": (
        "the event source mapping lists the table's streams with the function's role"
    ),
    "ReconcilerRole/stream-and-logs#OnFailureDestination": (
        "Lambda sends a batch that exhausted its retries to the on-failure queue with the "
        "function's role"
    ),
    "ReconcilerRole/stream-and-logs#Logs": "the Lambda runtime writes the function's logs",
    "RecheckRole/queue-and-logs#ReceiveRechecks": (
        "the SQS event source mapping receives, deletes and extends the recheck messages "
        "with the function's role"
    ),
    "RecheckRole/queue-and-logs#Logs": "the Lambda runtime writes the function's logs",
    "AuditFunctionRole/AuditFunctionEventInvokeConfigOnFailureSQSPolicy#0": (
        "Lambda sends a failed asynchronous audit invocation to the audit failure queue"
    ),
    "ReconcilerPolicy#AlertEncryption": (
        "SNS calls KMS with the publisher's permissions to encrypt a message for the "
        "KMS-encrypted topic; the code only publishes"
    ),
}
# The same managed policy serves four functions: a grant one of them needs is attached to all.
SHARED = "ReconcilerPolicy#"


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    template = load_template(template_path())
    handlers = {spec["Properties"]["Handler"]: name for name, spec in _functions(template)}
    out = os.environ.get("TALLY_RECORD_CALLS")
    recording = Recorder(handlers, environment_roles(template), Path(out) if out else None)
    recording.install()
    try:
        yield recording
    finally:
        recording.uninstall()


@pytest.fixture(scope="module")
def deployments() -> dict[str, Deployment]:
    return {
        "example": Deployment(EXAMPLE),
        "existing": Deployment(EXISTING),
        "global home": Deployment(GLOBAL_HOME),
        "global replica": Deployment(GLOBAL_REPLICA),
    }


@pytest.fixture(scope="module")
def evidence() -> dict[str, list[Call]]:
    """Each scenario's recorded calls, by scenario name."""
    return {}


def _functions(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, body)
        for name, body in template["Resources"].items()
        if body["Type"] == "AWS::Serverless::Function"
    ]


@contextlib.contextmanager
def scenario(
    recorder: Recorder,
    evidence: dict[str, list[Call]],
    deployments: dict[str, Deployment],
    name: str,
    modes: tuple[str, ...],
) -> Iterator[None]:
    """Record what runs inside as scenario ``name``; then every call must be allowed."""
    start = len(recorder.calls)
    yield
    calls = recorder.calls[start:]
    evidence[name] = calls
    refused = [f"[{mode} table] {d}" for mode in modes for d in denials(calls, deployments[mode])]
    assert not refused, "calls the deployed policy refuses:\n" + "\n".join(refused)


def duckdb_rows(dynamodb: Any, table: str, rules: RuleSet, out: Path) -> list[dict[str, str]]:
    """The audit query's candidates over a local export of ``table``, run by DuckDB, as the
    lines of Athena's CSV result the state machine hands AuditCandidatesFunction."""
    export = write_export(dynamodb, table, out)
    audited = [r for r in rules if r.repair != "off" and _exportable(r, rules)]
    if not audited:
        return []  # the export engine refuses these rules: the scan engine audits them
    query = AuditQuery(audited, rules.table)
    return [
        {c: "" if v is None else str(v) for c, v in row.items()}
        for row in query_rows(query, export_files(export))
    ]


def _exportable(rule: Any, rules: RuleSet) -> bool:
    try:
        AuditQuery([rule], rules.table)
    except ValueError:
        return False
    return True


# --- the bundled rules, through every function -------------------------------------------


def test_bundled_rules_writer_stream_recheck_and_audits(
    stack: Any,
    repair_switches: str,
    recorder: Recorder,
    evidence: dict[str, list[Call]],
    deployments: dict[str, Deployment],
    tmp_path: Path,
) -> None:
    writer_api._writers.cache_clear()
    post, order = {"PK": "POST#a91f", "SK": "META"}, {"PK": "ORDER#17", "SK": "META"}
    project, users = (
        {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"},
        {"PK": "UserMetadata", "SK": "META"},
    )
    stack.put({**post, "likeTally": 0})
    stack.put({**order, "total": 0})
    with scenario(recorder, evidence, deployments, "bundled", tuple(deployments)):
        like = {"PK": "POST#a91f", "SK": "LIKE#USER#7c20"}
        keyed = {"Idempotency-Key": "like-7c20"}
        assert invoke("POST", "/children", {"key": like}, keyed)[0] == 201
        assert invoke("POST", "/children", {"key": like}, keyed)[0] == 201  # replayed
        assert invoke("DELETE", "/children", {"key": like})[0] == 200
        assert invoke("POST", "/children", {"key": like})[0] == 201
        line = {"PK": "ORDER#17", "SK": "LINE#3"}
        assert invoke("POST", "/children", {"key": line, "attributes": {"amount": 5}})[0] == 201
        assert invoke("PATCH", "/children", {"key": line, "amount": 12})[0] == 200
        for strategy in ("gapless", "atomic", "sortkey", "block"):
            status, body = invoke(
                "POST", "/allocations", {"counter": project, "strategy": strategy}
            )
            assert status == 201, body
        member = {"counter": users, "member_key": {"PK": "User#Kirk", "SK": "PROFILE"}}
        assert invoke("POST", "/allocations", member)[0] == 201
        assert invoke("POST", "/allocations", member)[0] == 409

        # Faults for the stream handler and the rechecks: drift (repaired), a sum off
        # (alerted), gaps in the collection and the index layout.
        stack.put({**post, "likeTally": 7})
        stack.put({**order, "total": 99})
        stack.put({**project, "lastIssue": 9})
        stack.put({**users, "LastID": 4})
        stack.settle()

        # The scan engine, then the export engine's candidates (DuckDB over an export).
        stack.put({**post, "likeTally": 3})
        audit_handler.handler({}, lambda_context())
        stack.put({**post, "likeTally": 5})
        rows = duckdb_rows(stack.dynamodb, stack.table, _rules(), tmp_path / "export")
        assert rows, "the export audit found no candidate to check"
        candidates_handler.handler({"Items": rows}, lambda_context())
        stack.settle()

        # The outbox: a publish that fails leaves its alert pending (the lease given back);
        # the next invocation leases it again and sends it.
        with pytest.MonkeyPatch.context() as broken:
            broken.setenv("AWS_ENDPOINT_URL_SNS", "http://127.0.0.1:9")  # nothing listens
            runtime._clients.cache_clear()
            stack.put({**post, "likeTally": 11})
            stack.pump()
        runtime._clients.cache_clear()
        stack.put({**post, "likeTally": 12})
        stack.settle()
    sites = " ".join(c.site for c in evidence["bundled"])
    assert "release_alert" in sites and "lease_alert" in sites, "the outbox's retry never ran"
    assert {c.function for c in evidence["bundled"]} >= {
        "WriterFunction",
        "ReconcilerFunction",
        "RecheckFunction",
        "AuditFunction",
        "AuditCandidatesFunction",
    }


def _rules() -> RuleSet:
    return runtime.rules()


# --- the bundled rules on a Global Table ------------------------------------------------


def test_global_table_writer_stream_and_rechecks_in_the_home_region(
    stack: Any,
    repair_switches: str,
    recorder: Recorder,
    evidence: dict[str, list[Call]],
    deployments: dict[str, Deployment],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The functions as a Global Table's stack runs them (GLOBAL_REGIONS, its Region the home):
    the writer API stamps, the reconciler reads a child of its own that another Region's write
    replaced, and the home Region judges a counter off once replication had its settle window.
    """
    for name, value in {
        "GLOBAL_REGIONS": "us-east-1,eu-west-1",
        "AWS_REGION": "us-east-1",
        "HOME_REGION": "us-east-1",
        "SETTLE_SECONDS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    settings.cache_clear()
    runtime.global_mode.cache_clear()
    writer_api._writers.cache_clear()
    post = {"PK": "POST#g1", "SK": "META"}
    stack.put({**post, "likeTally": 0})
    modes = ("global home", "global replica")
    # The layouts are what a Global Table's stacks deploy: the home Region's creates it.
    assert {"GlobalTable"} <= set(deployments["global home"].resources) - {"Table"}
    assert not {"Table", "GlobalTable"} & set(deployments["global replica"].resources)
    with scenario(recorder, evidence, deployments, "global", modes):
        # eu-west-1's heartbeat, as its stack's schedule puts it and replication brings it:
        # the home Region judges only while every link is live.
        monkeypatch.setenv("AWS_REGION", "eu-west-1")
        settings.cache_clear()
        runtime.global_mode.cache_clear()
        assert heartbeat.handler({}, lambda_context())["region"] == "eu-west-1"
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        settings.cache_clear()
        runtime.global_mode.cache_clear()
        like = {"PK": "POST#g1", "SK": "LIKE#USER#1"}
        assert invoke("POST", "/children", {"key": like})[0] == 201
        assert invoke("POST", "/children", {"key": {**like, "SK": "LIKE#USER#2"}})[0] == 201
        # eu-west-1's write of the same child replaces ours, as replication delivers it.
        stack.put({**like, ORIGIN: "eu-west-1", CHILD_ID: "eu-west-1:7c20"})
        stack.put({**post, "likeTally": 9})
        stack.settle()
    kinds = sorted(alert["kind"] for alert in stack.alerts())
    assert "overwritten" in kinds and "drift" in kinds, kinds
    settings.cache_clear()
    runtime.global_mode.cache_clear()
    writer_api._writers.cache_clear()


# --- every example under examples/adopting/ --------------------------------------------


def _set(adopted: Adopted, key: dict[str, Any], attribute: str, value: int) -> None:
    adopted.dynamodb.update_item(
        TableName=adopted.table,
        Key=key,
        UpdateExpression="SET #c = :v",
        ExpressionAttributeNames={"#c": attribute},
        ExpressionAttributeValues={":v": {"N": str(value)}},
    )


def _users(a: Adopted) -> None:
    seeds.create_user_metadata(a.dynamodb, a.table)
    for name in ("kirk", "spock"):
        seeds.add_user(a.dynamodb, a.table, name)
    _set(a, {"PK": {"S": "UserMetadata"}}, "LastID", 4)


def _orders(a: Adopted) -> None:
    for _ in range(2):
        examples.place_order(a.dynamodb, a.table)
    with pytest.raises(examples.Crash):
        examples.place_order(a.dynamodb, a.table, crash=True)


def _issues(a: Adopted) -> None:
    table = a.table_resource()
    for _ in range(3):
        seeds.open_issue(table, "PROJ")
    table.delete_item(Key={"pk": "PROJ", "sk": 2})


def _counter(a: Adopted) -> None:
    seeds.create_counter(a.dynamodb, a.table)
    for _ in range(3):
        seeds.take_number(a.dynamodb, a.table)
    _set(a, {"pk": {"S": "counter"}}, "count_value", 5)  # numbers 3 and 4 never used


def _projects(a: Adopted) -> None:
    client, table = a.dynamodb, a.table
    client.put_item(TableName=table, Item=serialize({"pk": "p1", "sk": 0, "lastIssue": 2}))
    for number in (1, 2, 3):  # 3 imported behind the counter's back
        client.put_item(TableName=table, Item=serialize({"pk": "p1", "sk": number}))


def _social(a: Adopted) -> None:
    examples.create_post(a.dynamodb, a.table, "POST#a")
    for user in ("u1", "u2"):
        examples.like(a.dynamodb, a.table, "POST#a", user)
    _set(a, {"PK": {"S": "POST#a"}, "SK": {"S": "META"}}, "likeTally", 9)


def _carts(a: Adopted) -> None:
    for item in (
        {"PK": "CART#1", "SK": "TOTAL", "quantity": 2},
        {"PK": "CART#1", "SK": "PRODUCT#a", "quantity": 1},
        {"PK": "CART#1", "SK": "PRODUCT#b", "quantity": 3},
    ):
        a.dynamodb.put_item(TableName=a.table, Item=serialize(item))


def _followers(a: Adopted) -> None:
    client, table = a.dynamodb, a.table
    for user in ("ann", "bob", "cy"):
        examples.create_profile(client, table, user)
    examples.follow(client, table, "ann", "bob", "2026-11-26")
    examples.follow(client, table, "cy", "bob", "2026-11-26")
    examples.block(client, table, "cy", "bob", "2026-11-27")
    examples.follow(client, table, "bob", "ann", "2026-11-26")
    examples.unfollow(client, table, "bob", "ann")
    _set(a, {"PK": {"S": "USER#bob"}, "SK": {"S": "PROFILE"}}, "followerCount", 5)


def _products(a: Adopted) -> None:
    for item in (
        {"pk": "product#p1", "sk": "totalquantity", "quantity": 3},
        {"pk": "cart#1", "sk": "product#p1", "quantity": 1, "expirationTime": 4102444800},
        {"pk": "user#u1", "sk": "product#p1", "quantity": 1, "expirationTime": 4102444800},
    ):
        a.dynamodb.put_item(TableName=a.table, Item=serialize(item))


# shape: (template of the table, table id, writer and faults, whether it settles quickly)
DRIVERS: dict[str, tuple[str, str, Callable[[Adopted], None], bool]] = {
    "users": ("users", "UsersTable", _users, True),
    "orders": ("orders", "OrdersTable", _orders, True),
    "issues": ("issues", "IssuesTable", _issues, True),
    "counter": ("counter", "CounterTable", _counter, True),
    "projects": ("projects", "ProjectsTable", _projects, True),
    "social": ("social", "SocialTable", _social, True),
    # A cart's total lags its products by 90 s: its rechecks are not waited for here.
    "carts": ("social", "SocialTable", _carts, False),
    "followers": ("followers", "FollowersTable", _followers, True),
    # A product's total lags its cart lines by 90 s: its rechecks are not waited for here.
    "products": ("products", "ShoppingCartTable", _products, False),
}


def test_every_example_has_a_driver() -> None:
    assert sorted(DRIVERS) == SHAPES


@pytest.mark.parametrize("shape", SHAPES)
def test_example_through_the_pump_and_the_audits(
    shape: str,
    adopt: Callable[..., Adopted],
    recorder: Recorder,
    evidence: dict[str, list[Call]],
    deployments: dict[str, Deployment],
    tmp_path: Path,
) -> None:
    template, table_id, drive, settles = DRIVERS[shape]
    adopted = adopt(template, table_id, rules=EXAMPLES / shape / "rules.toml")
    with scenario(recorder, evidence, deployments, shape, ("existing",)):
        drive(adopted)
        if settles:
            adopted.settle()
        else:
            runner.pump(adopted.stack, adopted.state_dir).until_idle(30)
        runner.invoker(adopted.stack, "AuditFunction")({})
        rows = duckdb_rows(adopted.dynamodb, adopted.table, adopted.rules, tmp_path / "export")
        if rows:
            runner.invoker(adopted.stack, "AuditCandidatesFunction")({"Items": rows})
        if settles:
            adopted.settle()
    functions = {c.function for c in evidence[shape]}
    assert functions >= {"ReconcilerFunction", "AuditFunction"}, functions


# --- the writer's denial of the repair marker --------------------------------------------


def test_the_writer_is_denied_the_repair_marker(
    stack: Any, recorder: Recorder, deployments: dict[str, Deployment]
) -> None:
    """The writer's own client tries to write ``tallyRepair``: the recorded write is denied."""
    writer_api._writers.cache_clear()
    stack.put({"PK": "POST#m", "SK": "META", "likeTally": 0})
    start = len(recorder.calls)
    client = writer_api._writers()[0].client
    with acting_as("WriterFunction"):
        client.update_item(
            TableName=stack.table,
            Key=serialize({"PK": "POST#m", "SK": "META"}),
            UpdateExpression="SET #m = :m",
            ExpressionAttributeNames={"#m": "tallyRepair"},
            ExpressionAttributeValues=serialize({":m": "forged"}),
        )
    [call] = recorder.calls[start:]
    assert (call.function, call.action, call.attributes) == (
        "WriterFunction",
        "dynamodb:UpdateItem",
        ("PK", "SK", "tallyRepair"),
    )
    for deployment in deployments.values():
        decision = deployment.policy("WriterFunction").evaluate(request_of(call, deployment))
        assert not decision.allowed
        assert decision.denied_by is not None and decision.denied_by.effect == "Deny"
        # The same write without the marker is allowed: the Deny is what refuses it.
        plain = Call(**{**call.__dict__, "attributes": ("PK", "SK", "likeTally")})
        assert deployment.policy("WriterFunction").evaluate(request_of(plain, deployment)).allowed


# --- least privilege, and the check's own defects -----------------------------------------


def _all_scenarios(evidence: dict[str, list[Call]]) -> list[Call]:
    missing = sorted({"bundled", "global", *SHAPES} - set(evidence))
    if missing:
        pytest.fail(f"run the whole module: scenarios {missing} were not recorded")
    return [call for calls in evidence.values() for call in calls]


@pytest.mark.parametrize("mode", ["example", "existing", "global home", "global replica"])
def test_every_grant_is_called_or_says_why_not(
    mode: str, evidence: dict[str, list[Call]], deployments: dict[str, Deployment]
) -> None:
    # The examples' calls count on the example table too: the same code makes them there
    # when its rules use their layouts.
    calls = _all_scenarios(evidence)
    deployment = deployments[mode]
    # The functions this layout deploys (the heartbeat: a Global Table's only).
    functions = [f for f in CODE_FUNCTIONS if f in deployment.resources]
    unused = unexercised(calls, deployment, functions)
    # A grant of the shared managed policy counts as used when any function it serves uses it.
    used_shared = {
        (statement.label, action, resource)
        for function, statement, action, resource in grants(deployment, functions)
        if statement.label.startswith(SHARED)
        and (function, statement.label, action, resource) not in set(unused)
    }
    unexplained = [
        f"{function}: {label} {action} on {resource}"
        for function, label, action, resource in unused
        if label not in NOT_CALLED
        and f"{label} {action}" not in NOT_CALLED
        and (label, action, resource) not in used_shared
    ]
    assert not unexplained, "grants no recorded call used and NOT_CALLED does not explain:\n" + (
        "\n".join(unexplained)
    )


def test_removing_any_action_the_code_calls_fails_naming_function_action_and_call_site(
    evidence: dict[str, list[Call]],
) -> None:
    """Each action some recorded call needs, taken out of template.yaml on its own."""
    calls = [c for c in _all_scenarios(evidence) if not c.site.startswith("(outside")]
    template = load_template(template_path())
    for action in sorted({c.action for c in calls}):
        planted = Deployment(EXISTING, without_action(template, action))
        refused = denials([c for c in calls if c.function in planted.resources], planted)
        # A function only a Global Table's stacks deploy (the heartbeat), in both of theirs.
        only_global = [c for c in calls if c.function not in planted.resources]
        for layout in (GLOBAL_HOME, GLOBAL_REPLICA) if only_global else ():
            refused += denials(only_global, Deployment(layout, without_action(template, action)))
        assert refused, f"removing {action} refused no recorded call"
        assert all(action in line and "called at tally/" in line for line in refused), refused
        print(f"without {action}:", *refused, sep="\n  ")
