"""The scheduled heartbeat of a Global Table's Region (docs/global-tables.md, "Heartbeats"):
it puts that Region's heartbeat item, stamped by its clock; a single-Region stack beats to
no one; a rule that would claim the item's key is refused before anything is written."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from tally.core.settings import settings
from tally.local.template import create_table, load_template, template_path
from tally.reconciler import runtime
from tally.reconciler.table.heartbeats import HeartbeatKeyError, Heartbeats
from tally.rules import DEFAULT_RULES_FILE, load_rules, parse_rules
from tests.unit.rules.test_stream_filter import NUMBERED_TEAMS
from tests.utils import deserialize, lambda_context

TABLE = "tally-table"


def _clear() -> None:
    settings.cache_clear()
    runtime.global_mode.cache_clear()
    runtime.rules.cache_clear()
    runtime._clients.cache_clear()


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.setenv("TABLE_NAME", TABLE)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Test")
    monkeypatch.setenv("RULES_FILE", str(DEFAULT_RULES_FILE))
    for name in ("DYNAMODB_ENDPOINT", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="eu-west-1")
        create_table(dynamodb, load_template(template_path()), "Table", TABLE)  # the example's
        _clear()
        yield dynamodb
    _clear()


def test_a_region_of_a_global_table_puts_its_heartbeat(
    table: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tally.handlers import heartbeat

    monkeypatch.setenv("GLOBAL_REGIONS", "us-east-1,eu-west-1")
    _clear()
    before = Decimal(str(time.time()))
    answer = heartbeat.handler({}, lambda_context())
    after = Decimal(str(time.time()))
    items = [deserialize(i) for i in table.scan(TableName=TABLE)["Items"]]  # type: ignore[attr-defined]
    assert len(items) == 1
    [item] = items
    assert (item["PK"], item["SK"], item["tallyOrigin"]) == (
        "tally#heartbeat#eu-west-1",
        "tally#heartbeat",
        "eu-west-1",
    )
    assert before - 1 <= item["tallyBeatAt"] <= after + 1
    assert answer == {"region": "eu-west-1", "beatAt": str(item["tallyBeatAt"])}


def test_a_single_region_stack_beats_to_no_one(table: object) -> None:
    from tally.handlers import heartbeat

    answer = heartbeat.handler({}, lambda_context())
    assert "skipped" in answer
    assert table.scan(TableName=TABLE)["Items"] == []  # type: ignore[attr-defined]


def test_a_rule_claiming_the_heartbeat_key_or_a_numeric_key_is_refused() -> None:
    claims = parse_rules(
        {
            "table": {"partition_key": "PK", "sort_key": "SK"},
            "rules": [
                {
                    "name": "everything",
                    "kind": "count",
                    "parent": {"PK": "tally#*", "SK": "tally#heartbeat"},
                    "children": {"SK": "X#*"},
                    "counter": "n",
                }
            ],
        }
    )
    with pytest.raises(HeartbeatKeyError, match="rule 'everything' claims the heartbeat key"):
        Heartbeats.of(object(), TABLE, claims, ("us-east-1", "eu-west-1"))
    with pytest.raises(HeartbeatKeyError, match="key attribute 'team' is a N"):
        Heartbeats.of(object(), TABLE, parse_rules(NUMBERED_TEAMS), ("eu-west-1",))
    numeric_sort = parse_rules(
        {
            "table": {"partition_key": "PK", "sort_key": "n", "sort_key_type": "N"},
            "rules": [
                {
                    "name": "members",
                    "kind": "count",
                    "parent": {"PK": "TEAM#*", "n": "0"},
                    "children": {"n": "*"},
                    "counter": "members",
                }
            ],
        }
    )
    with pytest.raises(HeartbeatKeyError, match="key attribute 'n' is a N"):
        Heartbeats.of(object(), TABLE, numeric_sort, ("eu-west-1",))
    # The bundled rules leave the key alone.
    assert Heartbeats.of(object(), TABLE, load_rules(DEFAULT_RULES_FILE), ("eu-west-1",)).key(
        "eu-west-1"
    ) == {
        "PK": "tally#heartbeat#eu-west-1",
        "SK": "tally#heartbeat",
    }


def test_no_rule_file_in_the_repository_claims_the_heartbeat_key() -> None:
    root = Path(__file__).resolve().parents[3]
    for path in [DEFAULT_RULES_FILE, *sorted((root / "examples").rglob("rules.toml"))]:
        rules = load_rules(path)
        if all(rules.table.type_of(name) == "S" for name in rules.table.names):
            Heartbeats.of(object(), TABLE, rules, ("us-east-1", "eu-west-1", "ap-southeast-2"))
