"""A ``through`` rule against the table it reads: the index must exist, be global, be keyed
by the rule's attributes and project what a sum adds up; local mode builds such an index
from the rules alone, and every rules file with a template beside it fits that template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from tally.local.stack_record import LocalStackError
from tally.local.stack_resources import counted_table
from tally.local.template import (
    create_table_from,
    create_table_kwargs,
    load_template,
    rules_table_kwargs,
)
from tally.rules import load_rules, parse_rules
from tally.rules.live_table import TableShape, schema_problems
from tests.harness.index_tables import FOLLOWERS
from tests.harness.index_tables import gsi as index

ROOT = Path(__file__).resolve().parents[3]

SPENT: dict[str, Any] = {
    "name": "spent",
    "kind": "sum",
    "parent": {"PK": "SHOP#*", "SK": "TOTAL"},
    "children": {"SK": "ORDER#*"},
    "counter": "total",
    "summed": "amount",
    "through": {"index": "ByShop", "partition_key": "shop"},
}


def table(*indexes: dict[str, Any], local: bool = False, types: dict[str, str] | None = None):
    """create_table kwargs of a PK/SK table with these indexes (keys typed S unless said)."""
    named = {"PK": "S", "SK": "S"}
    for spec in indexes:
        for key in spec["KeySchema"]:
            named.setdefault(key["AttributeName"], "S")
    named |= types or {}
    kind = "LocalSecondaryIndexes" if local else "GlobalSecondaryIndexes"
    return {
        "TableName": "social",
        "AttributeDefinitions": [
            {"AttributeName": n, "AttributeType": t} for n, t in named.items()
        ],
        "KeySchema": [
            {"AttributeName": "PK", "KeyType": "HASH"},
            {"AttributeName": "SK", "KeyType": "RANGE"},
        ],
        "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        **({kind: list(indexes)} if indexes else {}),
    }


def problems(rule: dict[str, Any], kwargs: dict[str, Any]) -> list[str]:
    return schema_problems(parse_rules({"rules": [rule]}), TableShape.of(kwargs))


GSI1 = index("GSI1", "GSI1PK", "GSI1SK")


def test_the_index_a_rule_reads_as_it_says_raises_nothing() -> None:
    assert problems(FOLLOWERS, table(GSI1)) == []
    without_sort = FOLLOWERS | {"through": {"index": "GSI1", "partition_key": "GSI1PK"}}
    assert problems(without_sort, table(GSI1)) == []
    assert problems(SPENT, table(index("ByShop", "shop", None, "INCLUDE", "amount"))) == []
    assert problems(SPENT, table(index("ByShop", "shop", "SK", "ALL"))) == []


@pytest.mark.parametrize(
    ("rule", "kwargs", "field", "says"),
    [
        (FOLLOWERS, table(), "through.index", "no index 'GSI1'"),
        (FOLLOWERS, table(index("Other", "GSI1PK", "GSI1SK")), "through.index", "no index"),
        (
            FOLLOWERS,
            table(index("GSI1", "SK", "GSI1SK"), local=False),
            "through.partition_key",
            "partition key 'SK', not 'GSI1PK'",
        ),
        (
            FOLLOWERS,
            table(index("GSI1", "PK", "GSI1SK"), local=True),
            "through.index",
            "local index",
        ),
        (
            FOLLOWERS,
            table(index("GSI1", "GSI1PK")),
            "through.sort_key",
            "no sort key, not 'GSI1SK'",
        ),
        (
            FOLLOWERS,
            table(index("GSI1", "GSI1PK", "created")),
            "through.sort_key",
            "the sort key 'created', not 'GSI1SK'",
        ),
        (
            FOLLOWERS,
            table(GSI1, types={"GSI1PK": "N"}),
            "through.partition_key",
            "keys 'GSI1PK' as N",
        ),
        (
            FOLLOWERS,
            table(GSI1, types={"GSI1SK": "N"}),
            "through.sort_prefix",
            "a prefix needs a string sort key",
        ),
        (
            SPENT,
            table(index("ByShop", "shop")),
            "through.index",
            "projects KEYS_ONLY: it must project 'amount'",
        ),
        (
            SPENT,
            table(index("ByShop", "shop", None, "INCLUDE", "currency")),
            "through.index",
            "projects INCLUDE (it includes currency): it must project 'amount'",
        ),
    ],
)
def test_an_index_that_cannot_give_the_rule_its_children_is_named_by_field(
    rule: dict[str, Any], kwargs: dict[str, Any], field: str, says: str
) -> None:
    (problem,) = problems(rule, kwargs)
    assert problem.startswith(f"rule {rule['name']!r} field {field!r}: "), problem
    assert says in problem, problem


def test_a_keys_only_index_projects_the_keys_alone() -> None:
    """KEYS_ONLY projects the table's and the index's keys: nothing else."""
    (problem,) = problems(SPENT, table(index("ByShop", "shop", "SK")))
    assert "'amount'" in problem
    kwargs = table(index("ByShop", "shop", "SK"))
    shape = TableShape.of(kwargs).index("ByShop")
    assert shape is not None
    assert shape.projects("SK", ("PK", "SK")) and shape.projects("PK", ("PK", "SK"))
    assert shape.projects("shop", ("PK", "SK")) and not shape.projects("amount", ("PK", "SK"))


def test_a_shape_built_by_hand_keeps_its_index_names() -> None:
    shape = TableShape.of(table(GSI1))
    by_hand = TableShape(shape.name, shape.keys, shape.stream_view, frozenset({"GSI1"}))
    assert by_hand.index("GSI1") is None
    assert schema_problems(parse_rules({"rules": [FOLLOWERS]}), by_hand) == []
    assert shape.indexes == frozenset({"GSI1"})


def test_the_table_built_from_the_rules_has_the_indexes_they_read() -> None:
    rules = parse_rules({"rules": [FOLLOWERS, SPENT]})
    kwargs = rules_table_kwargs(rules, "t")
    assert schema_problems(rules, TableShape.of(kwargs)) == []
    indexes = {i["IndexName"]: i for i in kwargs["GlobalSecondaryIndexes"]}
    assert indexes["GSI1"]["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert [k["AttributeName"] for k in indexes["GSI1"]["KeySchema"]] == ["GSI1PK", "GSI1SK"]
    assert indexes["ByShop"]["Projection"] == {
        "ProjectionType": "INCLUDE",
        "NonKeyAttributes": ["amount"],
    }
    with mock_aws():  # and DynamoDB takes it as it is
        client = boto3.client("dynamodb", region_name="us-east-1")
        described = create_table_from(client, kwargs, None)
    assert schema_problems(rules, TableShape.of(described)) == []


def test_a_count_and_a_sum_through_one_index_share_its_projection() -> None:
    count = SPENT | {"name": "orders", "kind": "count", "counter": "orders"}
    del count["summed"]
    rules = parse_rules({"rules": [count, SPENT | {"children": {"SK": "REFUND#*"}}]})
    (only,) = rules_table_kwargs(rules, "t")["GlobalSecondaryIndexes"]
    assert only["Projection"] == {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["amount"]}


def test_local_mode_refuses_a_template_without_the_index(tmp_path: Path) -> None:
    body = (ROOT / "examples/adopting/followers/template.yaml").read_text()
    path = tmp_path / "template.yaml"
    path.write_text(body.replace("IndexName: GSI1", "IndexName: ByFollowee"))
    rules = ROOT / "examples/adopting/followers/rules.toml"
    with pytest.raises(LocalStackError, match=r"field 'through\.index': .* no index 'GSI1'"):
        counted_table(rules, path, "FollowersTable")


def _tables(template: dict[str, Any]) -> list[str]:
    resources = template.get("Resources", {})
    return [n for n, r in resources.items() if r.get("Type") == "AWS::DynamoDB::Table"]


def _rules_beside_templates() -> list[tuple[Path, Path, str]]:
    found = [(ROOT / "src" / "rules.toml", ROOT / "template.yaml", "Table")]
    for rules in sorted((ROOT / "examples" / "adopting").glob("*/rules.toml")):
        path = rules.parent / "template.yaml"
        if path.is_file():
            (logical_id,) = _tables(load_template(path))
            found.append((rules, path, logical_id))
    return found


@pytest.mark.parametrize(
    ("rules_file", "template", "logical_id"),
    _rules_beside_templates(),
    ids=lambda v: v.parent.name if isinstance(v, Path) and v.name == "rules.toml" else "",
)
def test_every_rules_file_fits_the_table_of_its_template(
    rules_file: Path, template: Path, logical_id: str
) -> None:
    kwargs = create_table_kwargs(load_template(template), logical_id, "t")
    assert schema_problems(load_rules(rules_file), TableShape.of(kwargs)) == []


def test_the_examples_with_an_index_are_among_them() -> None:
    names = {rules.parent.name for rules, _, _ in _rules_beside_templates()}
    assert {"src", "followers", "products"} <= names


def test_local_mode_from_the_rules_alone_builds_the_index_and_the_ttl() -> None:
    table = counted_table(ROOT / "examples/adopting/products/rules.toml", None)
    assert table.source == "rules" and table.ttl_attribute == "expirationTime"
    (gsi,) = table.kwargs["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == "ProductCarts"
    assert [k["AttributeName"] for k in gsi["KeySchema"]] == ["sk", "pk"]
