"""Templates are read with every short-form intrinsic function CloudFormation documents
(docs/local.md): each tag becomes its long form, nested ones too, as CloudFormation reads
them; a tag it may add later reads the same way."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tally.local.template import TemplateError, load_template

# Every function of the CloudFormation Template Reference's "Intrinsic function reference"
# and "Rule functions" with a short form (Fn::ForEach has none), each inside another.
EVERY_FUNCTION = """
    Parameters:
      Env: {Type: String}
      Vpc: {Type: "AWS::EC2::VPC::Id"}
    Mappings:
      Units: {prod: {Read: 5}}
    Rules:
      ProdInOneVpc:
        RuleCondition: !Equals [!Ref Env, prod]
        Assertions:
          - Assert: !Contains [[prod, test], !Ref Env]
          - Assert: !EachMemberEquals [!ValueOfAll ["AWS::EC2::Subnet::Id", VpcId], !Ref Vpc]
          - Assert: !EachMemberIn
              - !ValueOfAll ["AWS::EC2::Subnet::Id", VpcId]
              - !RefAll "AWS::EC2::VPC::Id"
          - Assert: !Not [!Equals [!ValueOf [Vpc, Tags], ""]]
    Conditions:
      IsProd: !Equals [!Ref Env, prod]
      Either: !Or
        - !Condition IsProd
        - !And
          - !Not [!Condition IsProd]
          - !Equals [!Select [0, !Split [",", !ImportValue shared-envs]], test]
    Resources:
      Table:
        Type: AWS::DynamoDB::Table
        Properties:
          TableName: !Join ["-", [!Ref "AWS::StackName", !Select [1, !GetAZs ""]]]
          Tags:
            - {Key: cidr, Value: !Select [0, !Cidr [!GetAtt Network.CidrBlock, 2, "8"]]}
            - {Key: count, Value: !Length [!Split [",", !Sub "${Env},extra"]]}
            - Key: json
              Value: !ToJsonString
                read: !FindInMap [Units, !Ref Env, Read]
                env: !If [IsProd, !Ref Env, !Ref "AWS::NoValue"]
            - {Key: data, Value: !Base64 {"Fn::Sub": "${Env}-${AWS::Region}"}}
            - Key: name
              Value: !Sub
                - "${Name}-${Vpc}"
                - Name: !GetStackOutput {StackName: network, OutputName: !GetAtt [Vpc, Id]}
            - {Key: output, Value: !GetAtt Nested.Outputs.VpcId}
          Fn::Transform: !Transform
            Name: AWS::Include
            Parameters: {Location: !Sub "s3://${Env}/table.yaml"}
"""

LONG_FORM = {
    "Parameters": {"Env": {"Type": "String"}, "Vpc": {"Type": "AWS::EC2::VPC::Id"}},
    "Mappings": {"Units": {"prod": {"Read": 5}}},
    "Rules": {
        "ProdInOneVpc": {
            "RuleCondition": {"Fn::Equals": [{"Ref": "Env"}, "prod"]},
            "Assertions": [
                {"Assert": {"Fn::Contains": [["prod", "test"], {"Ref": "Env"}]}},
                {
                    "Assert": {
                        "Fn::EachMemberEquals": [
                            {"Fn::ValueOfAll": ["AWS::EC2::Subnet::Id", "VpcId"]},
                            {"Ref": "Vpc"},
                        ]
                    }
                },
                {
                    "Assert": {
                        "Fn::EachMemberIn": [
                            {"Fn::ValueOfAll": ["AWS::EC2::Subnet::Id", "VpcId"]},
                            {"Fn::RefAll": "AWS::EC2::VPC::Id"},
                        ]
                    }
                },
                {"Assert": {"Fn::Not": [{"Fn::Equals": [{"Fn::ValueOf": ["Vpc", "Tags"]}, ""]}]}},
            ],
        }
    },
    "Conditions": {
        "IsProd": {"Fn::Equals": [{"Ref": "Env"}, "prod"]},
        "Either": {
            "Fn::Or": [
                {"Condition": "IsProd"},
                {
                    "Fn::And": [
                        {"Fn::Not": [{"Condition": "IsProd"}]},
                        {
                            "Fn::Equals": [
                                {
                                    "Fn::Select": [
                                        0,
                                        {"Fn::Split": [",", {"Fn::ImportValue": "shared-envs"}]},
                                    ]
                                },
                                "test",
                            ]
                        },
                    ]
                },
            ]
        },
    },
    "Resources": {
        "Table": {
            "Type": "AWS::DynamoDB::Table",
            "Properties": {
                "TableName": {
                    "Fn::Join": [
                        "-",
                        [{"Ref": "AWS::StackName"}, {"Fn::Select": [1, {"Fn::GetAZs": ""}]}],
                    ]
                },
                "Tags": [
                    {
                        "Key": "cidr",
                        "Value": {
                            "Fn::Select": [
                                0,
                                {"Fn::Cidr": [{"Fn::GetAtt": ["Network", "CidrBlock"]}, 2, "8"]},
                            ]
                        },
                    },
                    {
                        "Key": "count",
                        "Value": {
                            "Fn::Length": [{"Fn::Split": [",", {"Fn::Sub": "${Env},extra"}]}]
                        },
                    },
                    {
                        "Key": "json",
                        "Value": {
                            "Fn::ToJsonString": {
                                "read": {"Fn::FindInMap": ["Units", {"Ref": "Env"}, "Read"]},
                                "env": {
                                    "Fn::If": ["IsProd", {"Ref": "Env"}, {"Ref": "AWS::NoValue"}]
                                },
                            }
                        },
                    },
                    {"Key": "data", "Value": {"Fn::Base64": {"Fn::Sub": "${Env}-${AWS::Region}"}}},
                    {
                        "Key": "name",
                        "Value": {
                            "Fn::Sub": [
                                "${Name}-${Vpc}",
                                {
                                    "Name": {
                                        "Fn::GetStackOutput": {
                                            "StackName": "network",
                                            "OutputName": {"Fn::GetAtt": ["Vpc", "Id"]},
                                        }
                                    }
                                },
                            ]
                        },
                    },
                    # A string GetAtt splits at its first dot: a nested stack's output.
                    {"Key": "output", "Value": {"Fn::GetAtt": ["Nested", "Outputs.VpcId"]}},
                ],
                "Fn::Transform": {
                    "Fn::Transform": {
                        "Name": "AWS::Include",
                        "Parameters": {"Location": {"Fn::Sub": "s3://${Env}/table.yaml"}},
                    }
                },
            },
        }
    },
}


def written(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "template.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def test_every_short_form_reads_as_its_long_form_nested_ones_too(tmp_path: Path) -> None:
    assert load_template(written(tmp_path, EVERY_FUNCTION)) == LONG_FORM


def test_a_tag_cloudformation_may_add_later_reads_as_a_function_of_that_name(
    tmp_path: Path,
) -> None:
    body = "Outputs: {A: {Value: !NewFunction [x, !Ref y]}, B: {Value: !Other {k: v}}}\n"
    assert load_template(written(tmp_path, body))["Outputs"] == {
        "A": {"Value": {"Fn::NewFunction": ["x", {"Ref": "y"}]}},
        "B": {"Value": {"Fn::Other": {"k": "v"}}},
    }


def test_python_tags_still_build_no_objects(tmp_path: Path) -> None:
    body = "Resources: !!python/object/apply:os.system ['echo no']\n"
    with pytest.raises(TemplateError, match="not valid YAML"):
        load_template(written(tmp_path, body))
