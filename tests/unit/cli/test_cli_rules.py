"""The CLI's rules file: --rules, else RULES_FILE, else the local stack's, else the bundled one;
`tally rules filter`, and mistakes as a message and exit code 2."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from tally.cli import app as cli
from tally.cli import targets
from tally.core.dynamodb import serialize
from tally.local.stack_record import LocalStack
from tally.local.template import create_table_from, create_table_kwargs, load_template
from tally.rules import DEFAULT_RULES_FILE, load_rules
from tally.rules.stream_filter import filter_json

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "adopting"
ORDERS = EXAMPLES / "orders" / "rules.toml"
SOCIAL = EXAMPLES / "social" / "rules.toml"


@pytest.fixture(autouse=True)
def no_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("RULES_FILE", raising=False)
    monkeypatch.delenv("TABLE_NAME", raising=False)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_rules_filter_prints_the_filter_of_the_named_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "rules", "filter", "--rules", str(ORDERS))
    assert code == 0 and out.strip() == filter_json(load_rules(ORDERS))
    assert json.loads(out)["dynamodb"]["Keys"]["pk"]["S"][0] == "orderCounter"


def test_a_global_tables_filter_admits_the_heartbeats_and_nothing_else_more(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for rules in (ORDERS, SOCIAL, DEFAULT_RULES_FILE):
        code, out, _ = run(capsys, "rules", "filter", "--global-table", "--rules", str(rules))
        plain = json.loads(filter_json(load_rules(rules)))
        [(pk, typed)] = plain["dynamodb"]["Keys"].items()
        assert code == 0
        assert json.loads(out) == {
            "dynamodb": {"Keys": {pk: {"S": [*typed["S"], {"prefix": "tally#heartbeat#"}]}}}
        }
    numeric = tmp_path / "rules.toml"
    numeric.write_text(
        '[table]\npartition_key = "team"\nsort_key = "sk"\npartition_key_type = "N"\n\n'
        '[[rules]]\nname = "members"\nkind = "count"\nparent = { team = "7", sk = "META" }\n'
        'children = { sk = "MEMBER#*" }\ncounter = "members"\n'
    )
    code, out, err = run(capsys, "rules", "filter", "--global-table", "--rules", str(numeric))
    assert code != 0 and out == "" and "Traceback" not in err
    assert "--global-table" in err and "'team'" in err


def test_rules_file_variable_is_honoured_and_the_flag_beats_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RULES_FILE", str(SOCIAL))
    assert run(capsys, "rules", "filter")[1].strip() == filter_json(load_rules(SOCIAL))
    assert run(capsys, "rules", "filter", "--rules", str(ORDERS))[1].strip() == filter_json(
        load_rules(ORDERS)
    )


def test_without_either_the_local_stacks_rules_then_the_bundled_ones(
    no_stack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with targets.environment(None, None):
        assert Path(os.environ["RULES_FILE"]).resolve() == DEFAULT_RULES_FILE.resolve()
    recorded = LocalStack(
        started_at="now",
        dynamodb_endpoint="http://127.0.0.1:1",
        dynamodb_pid=None,
        dynamodb_port=None,
        moto_endpoint="http://127.0.0.1:2",
        moto_pid=1,
        moto_port=2,
        table_name="t",
        table_stream_arn="arn",
        audit_table_name="a",
        alert_topic_arn="arn",
        alert_inbox_url="u",
        alert_subscription_arn="arn",
        recheck_queue_url="u",
        recheck_dead_letter_queue_url="u",
        stream_failure_queue_url="u",
        state_dir=no_stack,
        rules_file=str(SOCIAL),
    )
    recorded.save()
    with targets.environment(None, None):
        assert os.environ["RULES_FILE"] == str(SOCIAL)
    with targets.environment(None, ORDERS):
        assert os.environ["RULES_FILE"] == str(ORDERS)
    assert "RULES_FILE" not in os.environ


def test_a_broken_rules_file_is_a_message_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "rules.toml"
    broken.write_text(SOCIAL.read_text().replace('counter = "likeTally"', 'countr = "x"'))
    code, out, err = run(capsys, "rules", "filter", "--rules", str(broken))
    assert code == 2 and out == ""
    assert "'likes'" in err and "'countr'" in err and "Traceback" not in err


def test_rules_check_without_a_table_says_how_to_name_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "rules", "check", "--rules", str(SOCIAL))
    assert code == 1 and "tally local up" in err and "TABLE_NAME" in err


@pytest.mark.parametrize(
    "args",
    [
        ["local", "up", "--table-id", "SocialTable"],
        ["local", "env", "--template", str(EXAMPLES / "social" / "template.yaml")],
    ],
)
def test_table_options_in_the_wrong_place_are_usage_errors(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, *args)
    assert code == 2 and "--table-id" in err and "--template" in err


def test_a_sample_size_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["rules", "suggest", "--sample", "0"])
    assert exit_.value.code == 2
    assert "--sample" in capsys.readouterr().err


@pytest.fixture
def social_table(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A PK/SK table in moto holding two posts, each with its likes and a counter that agrees."""
    for name in [n for n in os.environ if n.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        client = boto3.client("dynamodb")
        client.create_table(
            TableName="Social",
            KeySchema=[
                {"AttributeName": "PK", "KeyType": "HASH"},
                {"AttributeName": "SK", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "PK", "AttributeType": "S"},
                {"AttributeName": "SK", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        for post, likes in (("a", 3), ("b", 2)):
            items = [{"PK": f"POST#{post}", "SK": "META", "likeTally": likes}]
            items += [{"PK": f"POST#{post}", "SK": f"LIKE#{n}"} for n in range(likes)]
            for item in items:
                client.put_item(TableName="Social", Item=serialize(item))
        monkeypatch.setenv("TABLE_NAME", "Social")
        yield "Social"


def test_rules_suggest_and_check_report_as_json(
    social_table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "rules", "suggest", "--json")
    assert code == 0
    report = json.loads(out)
    assert (report["table"], report["sampled"]) == ("Social", 7)
    [proposal] = report["proposals"]
    assert (proposal["kind"], proposal["counter"]) == ("count", "likeTally")
    assert (proposal["parents_sampled"], proposal["parents_holding"]) == (2, 2)
    assert "[[rules]]" in report["rules"]
    code, out, _ = run(capsys, "rules", "check", "--rules", str(SOCIAL), "--json")
    assert json.loads(out)["sampled"] == 7


def test_rules_check_draws_its_table_like_the_audit(
    social_table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(capsys, "rules", "check", "--rules", str(SOCIAL))
    lines = out.splitlines()
    assert lines[0] == "table Social: 7 items sampled"
    header = next(line for line in lines if "children/members" in line)
    assert header.split() == [
        "rule",
        "kind",
        "parents",
        "children/members",
        "no",
        "counter",
        "not",
        "a",
        "number",
    ]
    assert any(line.strip().startswith("─") for line in lines)  # rich's SIMPLE box, as the audit


def test_rules_check_on_a_table_whose_children_are_found_through_an_index(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The followers example on its own template's table: edges counted as GSI1 counts them."""
    for name in [n for n in os.environ if n.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    followers = EXAMPLES / "followers"
    template = load_template(followers / "template.yaml")
    with mock_aws():
        client = boto3.client("dynamodb")
        create_table_from(client, create_table_kwargs(template, "FollowersTable", "Graph"), None)
        items = [
            {"PK": "USER#bob", "SK": "PROFILE", "followerCount": 1, "rev": 1},
            {"PK": "USER#ann", "SK": "PROFILE", "followerCount": 0, "rev": 0},
            {"PK": "USER#ann", "SK": "FOLLOWS#USER#bob"}
            | {"GSI1PK": "USER#bob", "GSI1SK": "FOLLOWING#2026-11-26"},
            {"PK": "USER#bob", "SK": "FOLLOWS#USER#ann"}
            | {"GSI1PK": "USER#ann", "GSI1SK": "BLOCKED#2026-11-26"},
        ]
        for item in items:
            client.put_item(TableName="Graph", Item=serialize(item))
        monkeypatch.setenv("TABLE_NAME", "Graph")
        rules = str(followers / "rules.toml")
        code, out, err = run(capsys, "rules", "check", "--rules", rules)
        assert (code, err) == (0, "")
        row = next(line for line in out.splitlines() if line.strip().startswith("followers"))
        assert row.split() == ["followers", "count", "2", "1", "0", "0"]
        assert "followers: 1 sampled items keyed like its children name no parent" in out
        assert out.rstrip().endswith("no flags")
        code, out, _ = run(capsys, "rules", "check", "--rules", rules, "--json")
        assert json.loads(out)["rules"]["followers"] == {
            "parents": 2,
            "children_or_members": 1,
            "not_counted": 1,
        }
