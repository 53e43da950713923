"""Reading template.yaml and turning its table into create_table kwargs."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tally.local.template import (
    TemplateResourceError,
    create_table_kwargs,
    load_template,
    template_path,
    time_to_live_attribute,
)


def _load(tmp_path: Path, text: str) -> dict[str, Any]:
    path = tmp_path / "template.yaml"
    path.write_text(textwrap.dedent(text))
    return load_template(path)


def test_short_form_tags_become_long_form(tmp_path: Path) -> None:
    loaded = _load(
        tmp_path,
        """
        ref: !Ref Table
        sub: !Sub "${Table.Arn}/index/*"
        getatt: !GetAtt Table.StreamArn
        getatt_nested: !GetAtt Db.Endpoint.Address
        getatt_list: !GetAtt [Table, Arn]
        if: !If [IsProd, !Ref A, !Ref "AWS::NoValue"]
        equals: !Equals [!Ref Env, prod]
        not: !Not [!Condition IsProd]
        and: !And [!Condition A, !Condition B]
        or: !Or [!Condition A, !Condition B]
        select: !Select [0, !GetAZs ""]
        join: !Join [",", [a, b]]
        split: !Split [",", "a,b"]
        map: !FindInMap [Map, !Ref "AWS::Region", Key]
        import: !ImportValue shared-table
        b64: !Base64 hello
        cidr: !Cidr ["10.0.0.0/16", 4, 8]
        sub_map: !Sub
          - "${X}"
          - X: !Ref Y
        """,
    )

    assert loaded == {
        "ref": {"Ref": "Table"},
        "sub": {"Fn::Sub": "${Table.Arn}/index/*"},
        "getatt": {"Fn::GetAtt": ["Table", "StreamArn"]},
        "getatt_nested": {"Fn::GetAtt": ["Db", "Endpoint.Address"]},
        "getatt_list": {"Fn::GetAtt": ["Table", "Arn"]},
        "if": {"Fn::If": ["IsProd", {"Ref": "A"}, {"Ref": "AWS::NoValue"}]},
        "equals": {"Fn::Equals": [{"Ref": "Env"}, "prod"]},
        "not": {"Fn::Not": [{"Condition": "IsProd"}]},
        "and": {"Fn::And": [{"Condition": "A"}, {"Condition": "B"}]},
        "or": {"Fn::Or": [{"Condition": "A"}, {"Condition": "B"}]},
        "select": {"Fn::Select": [0, {"Fn::GetAZs": ""}]},
        "join": {"Fn::Join": [",", ["a", "b"]]},
        "split": {"Fn::Split": [",", "a,b"]},
        "map": {"Fn::FindInMap": ["Map", {"Ref": "AWS::Region"}, "Key"]},
        "import": {"Fn::ImportValue": "shared-table"},
        "b64": {"Fn::Base64": "hello"},
        "cidr": {"Fn::Cidr": ["10.0.0.0/16", 4, 8]},
        "sub_map": {"Fn::Sub": ["${X}", {"X": {"Ref": "Y"}}]},
    }


def test_repo_template_loads_with_intrinsics() -> None:
    template = load_template(template_path())

    table_name = {
        "Fn::If": [
            "CreateTable",
            {"Ref": "Table"},
            {"Fn::If": ["CreateGlobalTable", {"Ref": "GlobalTable"}, {"Ref": "ExistingTableName"}]},
        ]
    }
    assert template["Outputs"]["TableName"]["Value"] == table_name
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["TABLE_NAME"] == table_name


def test_create_table_kwargs_from_repo_template() -> None:
    kwargs = create_table_kwargs(load_template(template_path()), "Table", "t1")

    assert kwargs == {
        "TableName": "t1",
        "AttributeDefinitions": [
            {"AttributeName": "PK", "AttributeType": "S"},
            {"AttributeName": "SK", "AttributeType": "S"},
            {"AttributeName": "seqName", "AttributeType": "S"},
            {"AttributeName": "NumIdentifier", "AttributeType": "N"},
        ],
        "KeySchema": [
            {"AttributeName": "PK", "KeyType": "HASH"},
            {"AttributeName": "SK", "KeyType": "RANGE"},
        ],
        "BillingMode": "PAY_PER_REQUEST",
        "GlobalSecondaryIndexes": [
            {
                "IndexName": "SequenceIndex",
                "KeySchema": [
                    {"AttributeName": "seqName", "KeyType": "HASH"},
                    {"AttributeName": "NumIdentifier", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    }


def test_provisioned_table_carries_throughput(tmp_path: Path) -> None:
    template = _load(
        tmp_path,
        """
Resources:
  T:
    Type: AWS::DynamoDB::Table
    Properties:
      AttributeDefinitions: [{AttributeName: PK, AttributeType: S}]
      KeySchema: [{AttributeName: PK, KeyType: HASH}]
      ProvisionedThroughput: {ReadCapacityUnits: 5, WriteCapacityUnits: "2"}
      GlobalSecondaryIndexes:
        - IndexName: G
          KeySchema: [{AttributeName: PK, KeyType: HASH}]
          Projection: {ProjectionType: ALL}
          ProvisionedThroughput: {ReadCapacityUnits: 1, WriteCapacityUnits: 1}
""",
    )

    kwargs = create_table_kwargs(template, "T", "t")

    assert kwargs["BillingMode"] == "PROVISIONED"
    assert kwargs["ProvisionedThroughput"] == {"ReadCapacityUnits": 5, "WriteCapacityUnits": 2}
    assert kwargs["GlobalSecondaryIndexes"][0]["ProvisionedThroughput"] == {
        "ReadCapacityUnits": 1,
        "WriteCapacityUnits": 1,
    }
    assert "StreamSpecification" not in kwargs
    assert time_to_live_attribute(template, "T") is None


def test_time_to_live_attribute_from_repo_template() -> None:
    assert time_to_live_attribute(load_template(template_path()), "Table") == "expiresAt"


@pytest.mark.parametrize(
    ("logical_id", "message"),
    [
        ("Missing", "template has no resource 'Missing'"),
        ("WriterFunction", "resource 'WriterFunction' is 'AWS::Serverless::Function'"),
    ],
)
def test_wrong_logical_id_is_named(logical_id: str, message: str) -> None:
    template = load_template(template_path())

    with pytest.raises(TemplateResourceError, match=message) as excinfo:
        create_table_kwargs(template, logical_id, "t")
    assert isinstance(excinfo.value, KeyError)
    with pytest.raises(TemplateResourceError, match=message):
        time_to_live_attribute(template, logical_id)
