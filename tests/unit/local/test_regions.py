"""A multi-Region local stack as values: the Regions and lag `tally local up --regions` takes,
the layout it refuses, its record in the state file, and what each Region's functions and
programs are given. No process is started (tests/integration/test_local_regions.py does)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Logger
from hypothesis import given
from hypothesis import strategies as st

from tally.local import regions, runner, stack
from tally.local.functions import ColdStart
from tally.local.regions import Layout, known_regions, parse_lag, parse_regions
from tally.local.stack_record import LocalStack, Replication, env, load, region_dir
from tally.local.state import STATE_FILE

KNOWN = sorted(known_regions())


def record(state_dir: Path, region: str = "us-east-1", front: int = 1) -> LocalStack:
    return LocalStack(
        started_at="2026-01-01T00:00:00+00:00",
        dynamodb_endpoint=f"http://127.0.0.1:{front}",
        dynamodb_pid=100 + front,
        dynamodb_port=8000 + front,
        moto_endpoint="http://127.0.0.1:5000",
        moto_pid=99,
        moto_port=5000,
        table_name="tally-local-table",
        table_stream_arn=f"arn:stream:{region}",
        audit_table_name="tally-local-audit",
        alert_topic_arn=f"arn:aws:sns:{region}:123456789012:tally-local-alerts",
        alert_inbox_url="http://127.0.0.1:5000/123456789012/tally-local-alert-inbox",
        alert_subscription_arn=f"arn:aws:sns:{region}:123456789012:tally-local-alerts:1",
        recheck_queue_url="http://127.0.0.1:5000/123456789012/tally-local-rechecks",
        recheck_dead_letter_queue_url="http://127.0.0.1:5000/123456789012/dead",
        stream_failure_queue_url="http://127.0.0.1:5000/123456789012/failures",
        state_dir=state_dir,
        table_source="template.yaml#Table",
        repair_switches_parameter="/tally/tally-local/repair-switches",
        region=region,
    )


def two_regions(state_dir: Path) -> LocalStack:
    replication = Replication(42, str(state_dir / "replication.json"), "eventual", 300, 2000)
    first = replace(record(state_dir), replication=replication)
    second = replace(
        record(region_dir(state_dir, "eu-west-1"), "eu-west-1", front=2), replication=replication
    )
    return replace(first, replicas=(second,))


# --- what `up --regions` takes --------------------------------------------------------------


@given(
    chosen=st.lists(st.sampled_from(KNOWN), min_size=2, max_size=5, unique=True),
    spaces=st.lists(st.sampled_from(["", " ", "  "]), min_size=10, max_size=10),
)
def test_any_list_of_distinct_regions_parses_back(chosen: list[str], spaces: list[str]) -> None:
    written = ",".join(f"{spaces[i]}{region}{spaces[-i - 1]}" for i, region in enumerate(chosen))
    assert parse_regions(written) == tuple(chosen)


@given(
    chosen=st.lists(st.sampled_from(KNOWN), min_size=1, max_size=3, unique=True),
    stranger=st.text(max_size=20).filter(lambda t: t.strip() not in KNOWN and "," not in t),
    at=st.integers(min_value=0, max_value=3),
)
def test_a_list_with_a_name_that_is_no_region_is_refused_naming_it(
    chosen: list[str], stranger: str, at: int
) -> None:
    given_ = [*chosen[:at], stranger, *chosen[at:]]
    with pytest.raises(ValueError, match="not an AWS Region DynamoDB runs in") as refused:
        parse_regions(",".join(given_))
    assert repr(stranger.strip()) in str(refused.value)


@given(region=st.sampled_from(KNOWN))
def test_one_region_or_one_twice_is_refused(region: str) -> None:
    with pytest.raises(ValueError, match="two Regions or more"):
        parse_regions(region)
    with pytest.raises(ValueError, match=f"{region} given twice"):
        parse_regions(f"{region},{region}")


@given(st.one_of(st.integers(), st.text(max_size=12)))
def test_a_lag_is_whole_milliseconds_up_to_an_hour(value: int | str) -> None:
    text = str(value)
    try:
        whole = int(text)
    except ValueError:
        whole = None
    if whole is not None and 0 <= whole <= regions.MAX_LAG_MS:
        assert parse_lag(text) == whole
    else:
        with pytest.raises(ValueError, match="milliseconds from 0 to 3600000"):
            parse_lag(text)


def test_the_strongly_consistent_profile_has_three_regions_one_database_and_no_lag() -> None:
    three = ("us-east-1", "eu-west-1", "ap-southeast-2")
    strong = Layout(three, "strong")
    assert strong.databases == ("us-east-1",)
    assert strong.replication() == Replication(0, "", "strong", regions=list(three))
    assert strong.replication().global_env() == {
        "GLOBAL_REGIONS": "us-east-1,eu-west-1,ap-southeast-2",
        "SETTLE_SECONDS": "5",
        "HEARTBEAT_SECONDS": "1",  # the pump beats every Region each fifth of the window
        "GLOBAL_CONSISTENCY": "strong",  # its repairs written apart: no transaction on it
    }
    with pytest.raises(ValueError, match="exactly three Regions, not 2"):
        Layout(three[:2], "strong")
    with pytest.raises(ValueError, match="no replication lag"):
        Layout(three, "strong", lag_ms=100)
    assert Layout(three).databases == three


def test_the_emulators_settings_name_each_regions_database_and_the_lag() -> None:
    databases = {"us-east-1": "http://127.0.0.1:1", "eu-west-1": "http://127.0.0.1:2"}
    drawn = regions.emulator_settings(Layout(tuple(databases)), databases, "t")
    assert drawn["regions"] == databases and drawn["tables"] == ["t"]
    assert drawn["lag"] == {"median_ms": 300, "p99_ms": 2000}
    fixed = regions.emulator_settings(Layout(tuple(databases), lag_ms=5000), databases, "t")
    assert fixed["lag"] == {"median_ms": 5000, "p99_ms": None}
    three = ("us-east-1", "eu-west-1", "ap-southeast-2")
    one = {"us-east-1": "http://127.0.0.1:1"}
    strong = regions.emulator_settings(Layout(three, "strong"), one, "t")
    assert strong["regions"] == dict.fromkeys(three, "http://127.0.0.1:1")
    assert (strong["consistency"], strong["lag"]) == ("strong", None)


def test_a_skew_reaches_the_emulator_and_the_stacks_description() -> None:
    databases = {"us-east-1": "http://127.0.0.1:1", "eu-west-1": "http://127.0.0.1:2"}
    layout = Layout(tuple(databases), lag_ms=300, skew_ms=regions.parse_skew("eu-west-1=-250"))
    assert regions.emulator_settings(layout, databases, "t")["skew_ms"] == {"eu-west-1": -250}
    assert layout.replication().describe().endswith("lag 300 ms, eu-west-1's clock -250 ms")
    assert regions.emulator_settings(Layout(tuple(databases)), databases, "t")["skew_ms"] == {}


@given(st.text(max_size=30))
def test_a_skew_is_parsed_or_refused_with_a_value_error(text: str) -> None:
    try:
        parsed = regions.parse_skew(text)
    except ValueError as refused:
        assert str(refused)
        return
    assert len({r for r, _ in parsed}) == len(parsed)
    assert all(abs(ms) <= regions.MAX_SKEW_MS for _, ms in parsed)


# --- the record --------------------------------------------------------------------------------


def test_a_multi_region_stack_is_recorded_whole_and_loads_back(tmp_path: Path) -> None:
    stack_ = two_regions(tmp_path)
    stack_.save()
    loaded = load(tmp_path)
    assert loaded == stack_
    assert loaded is not None and loaded.regions == ["us-east-1", "eu-west-1"]
    # Each Region after the first keeps its files apart; the first keeps the stack's own.
    assert loaded.in_region("eu-west-1").state_dir == tmp_path / "regions" / "eu-west-1"
    assert loaded.in_region("us-east-1").state_dir == tmp_path
    with pytest.raises(LookupError, match="runs us-east-1, eu-west-1, not ap-south-1"):
        loaded.in_region("ap-south-1")


def test_a_single_region_state_file_is_written_and_read_as_before(tmp_path: Path) -> None:
    single = record(tmp_path)
    single.save()
    written = json.loads((tmp_path / STATE_FILE).read_text())
    assert not {"region", "replication", "replicas"} & set(written)
    assert load(tmp_path) == single and single.replication is None and single.replicas == ()


def test_down_knows_every_process_of_the_stack_and_a_shared_database_once(
    tmp_path: Path,
) -> None:
    stack_ = two_regions(tmp_path)
    assert [(pid, marker, argument) for _, pid, marker, argument in stack._recorded(stack_)] == [
        (99, "moto.server", "5000"),
        (42, "tally.local.replication", str(tmp_path / "replication.json")),
        (101, "DynamoDBLocal.jar", "8001"),
        (102, "DynamoDBLocal.jar", "8002"),
    ]
    shared = replace(
        stack_,
        replicas=tuple(replace(r, dynamodb_pid=101, dynamodb_port=8001) for r in stack_.replicas),
    )
    assert [name for name, *_ in stack._recorded(shared)][2:] == [
        "DynamoDB Local of us-east-1, eu-west-1 (pid 101, port 8001)"
    ]


def test_a_regions_variables_point_at_its_endpoint_and_name_it(tmp_path: Path) -> None:
    eu = two_regions(tmp_path).in_region("eu-west-1")
    values = env(eu)
    assert values["AWS_ENDPOINT_URL_DYNAMODB"] == "http://127.0.0.1:2"
    assert values["AWS_DEFAULT_REGION"] == values["AWS_REGION"] == "eu-west-1"
    assert values["ALERT_TOPIC_ARN"] == "arn:aws:sns:eu-west-1:123456789012:tally-local-alerts"
    assert "AWS_REGION" not in env(record(tmp_path))  # a single-Region stack's, as before


def test_a_regions_functions_run_with_its_region_as_lambda_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def cold_start(spec: Any, values: dict[str, str]) -> ColdStart:
        def handler(event: dict[str, Any], context: Any) -> str:
            seen.update({k: os.environ.get(k) for k in ("AWS_REGION", "AWS_DEFAULT_REGION")})
            return str(context.invoked_function_arn)

        observability = type("Observability", (), {"logger": Logger(service="probe")})
        return ColdStart(handler, {"tally.core.observability": observability})  # type: ignore[dict-item]

    monkeypatch.setattr(runner, "cold_start", cold_start)
    eu = two_regions(tmp_path).in_region("eu-west-1")
    eu.state_dir.mkdir(parents=True)
    arn = runner.invoker(eu, "ReconcilerFunction")({})
    assert arn == "arn:aws:lambda:eu-west-1:000000000000:function:tally-local"
    assert seen == {"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-1"}


@pytest.mark.parametrize(
    ("median", "p99", "settle"), [(300, 2000, 20), (1000, None, 10), (0, None, 5), (None, None, 5)]
)
def test_the_functions_settle_window_is_ten_times_the_slowest_lag(
    median: int | None, p99: int | None, settle: int
) -> None:
    regions = ["us-east-1", "eu-west-1"]
    replication = Replication(1, "s.json", "eventual", median, p99, regions=regions)
    assert replication.global_env() == {
        "GLOBAL_REGIONS": "us-east-1,eu-west-1",
        "SETTLE_SECONDS": str(settle),
        "HEARTBEAT_SECONDS": str(max(1, settle // 5)),
        "GLOBAL_CONSISTENCY": "eventual",
    }
