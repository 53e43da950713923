"""The alarms and the dashboard read exactly what the handlers emit.

CloudWatch treats a metric with another dimension set as another metric: an alarm on
``Findings [Kind]`` never sees ``Findings [Kind, service]``. So the real handlers run here
with the template's environment on DynamoDB Local, with findings to report, and every
custom metric the template reads (namespace, name, exact dimension set) must be among
the EMF records they printed.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, get_args

import pytest

from tally.core.observability import metrics
from tally.reconciler.findings import Kind, RepairStatus
from tests.integration.conftest import Stack
from tests.integration.test_events import (
    EVENTS_DIR,
    Run,
    issue_counter,
    issues,
    likes,
    order,
    post,
)

# Dimension values the code chooses from a closed vocabulary; a widget may list all of them.
VOCABULARY = {"Kind": set(get_args(Kind)), "Outcome": set(get_args(RepairStatus))}


@dataclass(frozen=True)
class Read:
    """One metric the template reads: where, and with which dimensions."""

    where: str
    namespace: str
    name: str
    dimensions: dict[str, str]


@dataclass(frozen=True)
class Emitted:
    namespace: str
    name: str
    dimensions: dict[str, str]


def parse_emf(output: str) -> list[Emitted]:
    """Every metric of every EMF record (one JSON object per line) in the output."""
    emitted = []
    for line in output.splitlines():
        if not line.startswith("{") or '"_aws"' not in line:
            continue
        record = json.loads(line)
        for directive in record["_aws"]["CloudWatchMetrics"]:
            for dimension_set in directive["Dimensions"]:
                values = {name: str(record[name]) for name in dimension_set}
                for metric in directive["Metrics"]:
                    emitted.append(Emitted(directive["Namespace"], metric["Name"], values))
    return emitted


# --- what the template reads --------------------------------------------------------------


def alarm_reads(template: dict[str, Any]) -> Iterator[Read]:
    for name, body in template["Resources"].items():
        if body["Type"] != "AWS::CloudWatch::Alarm":
            continue
        props = body["Properties"]
        stats = [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
        if "MetricName" in props:
            stats.append(props)
        assert stats, f"{name} reads no metric"
        for metric in stats:
            dimensions = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
            yield Read(name, metric["Namespace"], metric["MetricName"], dimensions)


def dashboard_reads(template: dict[str, Any]) -> Iterator[Read]:
    body = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    # ${AWS::Region} and ${Function} placeholders become plain strings; the JSON stays valid.
    widgets = json.loads(re.sub(r"\$\{([^}]+)\}", r"<\1>", body))["widgets"]
    for widget in widgets:
        previous: list[Any] = []
        for row in widget["properties"].get("metrics", []):
            fields = [part for part in row if not isinstance(part, dict)]
            if fields[:1] == ["..."]:
                fields = previous[: len(previous) - len(fields) + 1] + fields[1:]
            # "." repeats the field at the same place in the row above.
            assert all(i < len(previous) for i, f in enumerate(fields) if f == "."), row
            fields = [previous[i] if part == "." else part for i, part in enumerate(fields)]
            previous = fields
            namespace, name, *pairs = fields
            assert len(pairs) % 2 == 0, f"dashboard row {row}: dimensions come in pairs"
            dimensions = dict(zip(pairs[::2], pairs[1::2], strict=True))
            yield Read(f"dashboard {widget['properties']['title']!r}", namespace, name, dimensions)


def unmatched(read: Read, emitted: list[Emitted]) -> str | None:
    """Why no emitted metric is the one ``read`` names; None when one is."""
    same_name = [e for e in emitted if (e.namespace, e.name) == (read.namespace, read.name)]
    if not same_name:
        return f"{read.namespace}/{read.name} was never emitted"
    dimension_sets = {tuple(sorted(e.dimensions)) for e in same_name}
    if tuple(sorted(read.dimensions)) not in dimension_sets:
        return (
            f"reads dimensions {sorted(read.dimensions)}, the code emits "
            f"{' or '.join(str(list(names)) for names in sorted(dimension_sets))}"
        )
    for name, value in read.dimensions.items():
        seen = {e.dimensions[name] for e in same_name if set(e.dimensions) == set(read.dimensions)}
        allowed = VOCABULARY.get(name, set()) | seen
        if value not in allowed:
            return f"reads {name}={value!r}, the code emits {name} from {sorted(allowed)}"
    return None


# --- running the handlers -----------------------------------------------------------------


def api_event(method: str, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    """An HTTP API request to /children, shaped like the sample events."""
    event: dict[str, Any] = json.loads(
        (EVENTS_DIR / "WriterFunction/api_add_child.json").read_text()
    )
    event = copy.deepcopy(event)
    event["requestContext"]["http"]["method"] = method
    event["body"] = json.dumps(body)
    event["headers"].pop("idempotency-key")
    if key:
        event["headers"]["idempotency-key"] = key
    return event


def sample(path: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS_DIR / path).read_text())
    return event


@pytest.fixture
def emitted(
    stack: Stack,
    repair_switches: str,
    template: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> list[Emitted]:
    """The EMF metrics of the four functions, each run on findings as Lambda would run it."""
    # As in a CLI process: Powertools was imported before any template environment was set.
    monkeypatch.setattr(metrics, "namespace", None)
    monkeypatch.setattr(metrics, "service", None)
    run = Run(stack, template, monkeypatch, repair_switches)
    for item in [post(100, 6), *likes("7c20", "19ab", "e5b2")]:
        stack.put(item)
    for item in [issue_counter(4), *issues(1, 2, 4), *order("99.00", "20.00", "10.00")]:
        stack.put(item)
    capsys.readouterr()

    # A rogue counter overwrite on the stream: drift, repaired.
    assert (
        run.invoke("ReconcilerFunction", sample("ReconcilerFunction/rogue_counter_overwrite.json"))[
            "batchItemFailures"
        ]
        == []
    )
    # A recheck after the grace period: number 3 is a gap.
    run.invoke("RecheckFunction", sample("RecheckFunction/recheck_message.json"))
    # The scheduled audit: the order's total is off (that rule only alerts).
    report = run.invoke("AuditFunction", sample("AuditFunction/scheduled_audit.json"))
    assert report["findings"] == {"drift": 1}
    # The writer API, once per outcome.
    like = {"key": {"PK": "POST#a91f", "SK": "LIKE#USER#metrics"}}
    line = {"key": {"PK": "ORDER#17", "SK": "LINE#1"}, "amount": 25}
    outcomes = [
        run.invoke("WriterFunction", api_event(method, body))["statusCode"]
        for method, body in [
            ("POST", like),
            ("POST", like),
            ("DELETE", like),
            ("DELETE", like),
            ("PATCH", line),
            ("PATCH", line),
        ]
    ]
    assert outcomes == [201, 409, 200, 404, 200, 200]
    found = parse_emf(capsys.readouterr().out)
    assert {e.name for e in found} >= {"Findings", "Repairs", "AuditItemsScanned"}
    return found


def test_every_alarm_and_dashboard_metric_is_emitted_as_read(
    emitted: list[Emitted], template: dict[str, Any]
) -> None:
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    namespace = variables["POWERTOOLS_METRICS_NAMESPACE"]
    reads = [*alarm_reads(template), *dashboard_reads(template)]
    custom = [r for r in reads if not r.namespace.startswith("AWS/")]
    assert len(custom) >= 20, "found too few custom metric reads: the parsing is broken"
    assert {r.namespace for r in custom} == {namespace}
    problems = [f"{r.where}: {r.name}: {why}" for r in custom if (why := unmatched(r, emitted))]
    assert not problems, "\n".join(problems)
    # Local runs too: the service dimension comes from the template, not from the process.
    unnamed = {
        e.name
        for e in emitted
        if e.dimensions.get("service") != variables["POWERTOOLS_SERVICE_NAME"]
    }
    assert not unnamed, f"emitted without the template's service dimension: {sorted(unnamed)}"


def test_aws_metrics_name_this_stacks_resources(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    for read in [*alarm_reads(template), *dashboard_reads(template)]:
        if read.namespace == "AWS/Lambda":
            value = read.dimensions["FunctionName"]
            target = value["Ref"] if isinstance(value, dict) else value.strip("<>")
            assert resources[target]["Type"] == "AWS::Serverless::Function", read
        elif read.namespace == "AWS/SQS":
            queue, attribute = read.dimensions["QueueName"]["Fn::GetAtt"]
            assert (resources[queue]["Type"], attribute) == ("AWS::SQS::Queue", "QueueName")


def test_a_removed_dimension_is_caught() -> None:
    """The comparison itself: the same metric with one dimension fewer does not match."""
    emitted = [Emitted("NS", "Findings", {"Kind": "drift", "service": "tally"})]
    assert (
        unmatched(Read("a", "NS", "Findings", {"Kind": "drift", "service": "tally"}), emitted)
        is None
    )
    assert unmatched(Read("a", "NS", "Findings", {"Kind": "drift"}), emitted)
    assert (
        unmatched(Read("a", "NS", "Findings", {"Kind": "gap", "service": "tally"}), emitted) is None
    )
    assert unmatched(Read("a", "NS", "Findings", {"Kind": "nope", "service": "tally"}), emitted)
    assert unmatched(Read("a", "NS", "Findings", {"Kind": "drift", "service": "x"}), emitted)
