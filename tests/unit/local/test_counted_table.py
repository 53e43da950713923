"""`tally local up`'s counted table: from the user's template or the rules, checked before any
process starts; what cannot hold the rules is a message naming the file and the problem."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tally.local.stack_record import LocalStackError
from tally.local.stack_resources import counted_table

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "adopting"
SOCIAL_RULES = EXAMPLES / "social" / "rules.toml"
ORDERS_RULES = EXAMPLES / "orders" / "rules.toml"


def template(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "template.yaml"
    path.write_text(textwrap.dedent(body))
    return path


SOCIAL_TABLE = """
    Resources:
      SocialTable:
        Type: AWS::DynamoDB::Table
        Properties:
          BillingMode: PAY_PER_REQUEST
          AttributeDefinitions:
            - {AttributeName: PK, AttributeType: S}
            - {AttributeName: SK, AttributeType: S}
          KeySchema:
            - {AttributeName: PK, KeyType: HASH}
            - {AttributeName: SK, KeyType: RANGE}
          TimeToLiveSpecification: {AttributeName: expiresAt, Enabled: true}
          STREAM
    """
STREAM = "StreamSpecification: {StreamViewType: NEW_AND_OLD_IMAGES}"


def test_the_users_table_with_its_ttl(tmp_path: Path) -> None:
    path = template(tmp_path, SOCIAL_TABLE.replace("STREAM", STREAM))
    table = counted_table(SOCIAL_RULES, path, "SocialTable")
    assert table.source == f"{path}#SocialTable" and table.ttl_attribute == "expiresAt"
    assert table.kwargs["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"


def test_a_template_with_a_transform_is_read(tmp_path: Path) -> None:
    transform = "Tags: !Transform {Name: TeamTags, Parameters: {Team: social}}"
    path = template(tmp_path, SOCIAL_TABLE.replace("STREAM", f"{STREAM}\n          {transform}"))
    table = counted_table(SOCIAL_RULES, path, "SocialTable")
    assert [k["AttributeName"] for k in table.kwargs["KeySchema"]] == ["PK", "SK"]


def test_a_table_without_a_stream_is_refused(tmp_path: Path) -> None:
    path = template(tmp_path, SOCIAL_TABLE.replace("STREAM", ""))
    with pytest.raises(LocalStackError, match=r"SocialTable.*\n.*no stream"):
        counted_table(SOCIAL_RULES, path, "SocialTable")


def test_keys_the_rules_do_not_name_are_refused(tmp_path: Path) -> None:
    path = template(tmp_path, SOCIAL_TABLE.replace("STREAM", STREAM))
    with pytest.raises(LocalStackError) as error:
        counted_table(ORDERS_RULES, path, "SocialTable")
    assert "'pk' (S)" in str(error.value) and "'PK' (S)" in str(error.value)


def test_an_unknown_logical_id_is_named(tmp_path: Path) -> None:
    path = template(tmp_path, SOCIAL_TABLE.replace("STREAM", STREAM))
    with pytest.raises(LocalStackError, match="'Orders'"):
        counted_table(SOCIAL_RULES, path, "Orders")


def test_an_intrinsic_in_the_key_schema_is_named(tmp_path: Path) -> None:
    body = SOCIAL_TABLE.replace("STREAM", STREAM).replace(
        "- {AttributeName: PK, KeyType: HASH}", "- !If [C, {AttributeName: PK}, x]"
    )
    with pytest.raises(LocalStackError, match="intrinsic"):
        counted_table(SOCIAL_RULES, template(tmp_path, body), "SocialTable")


def test_without_a_template_the_rules_key_schema_makes_the_table() -> None:
    table = counted_table(ORDERS_RULES, None)
    assert table.source == "rules"
    assert table.kwargs["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
