"""`tally examples load followers`: the graph its writers leave keeps every followerCount equal
to the FOLLOWING# edges naming the profile in GSI1; the fault breaks exactly one (moto)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import boto3
from moto import mock_aws

from tally.core.dynamodb import deserialize
from tally.local.examples import EXAMPLES
from tally.local.template import create_table_from, create_table_kwargs, load_template
from tally.rules import load_rules

FOLLOWERS = Path(__file__).resolve().parents[3] / "examples" / "adopting" / "followers"


def counts(client: Any) -> tuple[dict[str, Any], Counter[str]]:
    """Each profile's followerCount, and the truth: the edges the rule counts, per parent."""
    rules = load_rules(FOLLOWERS / "rules.toml")
    rule = rules["followers"]
    items = [deserialize(i) for i in client.scan(TableName="graph")["Items"]]
    stored = {i["PK"]: i["followerCount"] for i in items if i["SK"] == "PROFILE"}
    truth: Counter[str] = Counter()
    for item in items:
        for match in rules.classify(rules.key_of(item)):
            parent = rule.indexed_parent(item, rules.table) if match.role == "indexed" else None
            if parent is not None:
                truth[parent["PK"]] += 1
    return stored, truth


def test_the_writers_keep_every_count_and_the_fault_breaks_one(monkeypatch: Any) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    template = load_template(FOLLOWERS / "template.yaml")
    with mock_aws():
        client = boto3.client("dynamodb")
        create_table_from(client, create_table_kwargs(template, "FollowersTable", "graph"), None)
        example = EXAMPLES["followers"]
        written = example.load(client, "graph")
        assert written == client.scan(TableName="graph", Select="COUNT")["Count"]
        stored, truth = counts(client)
        assert len(stored) == 30 and sum(truth.values()) > 60
        assert all(stored[pk] == truth[pk] for pk in stored)
        said = example.fault(client, "graph")
        stored, truth = counts(client)
        assert [pk for pk in stored if stored[pk] != truth[pk]] == ["USER#u07"]
        assert stored["USER#u07"] == truth["USER#u07"] + 1 and "u07" in said
