"""What a new user meets first (issue 21): the table of their own template found without
naming it, and the same exit code and message for the same mistake on every command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tally.cli import app as cli
from tally.cli import local_commands
from tally.local import stack as local_stack
from tally.local.stack_record import LocalStackError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "adopting"
ROOT_TEMPLATE = Path(__file__).resolve().parents[3] / "template.yaml"


@pytest.fixture(autouse=True)
def no_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path / "state"))
    for name in ("TABLE_NAME", "AUDIT_TABLE_NAME", "ALERT_TOPIC_ARN", "RULES_FILE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def tally(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(args))
    except SystemExit as done:
        code = int(done.code or 0)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `tally local up` asked the stack for; nothing is started."""
    asked: dict[str, Any] = {}

    def up(state_dir: Path, **kwargs: Any) -> Any:
        asked.update(kwargs)
        raise LocalStackError("not started in this test")

    monkeypatch.setattr(local_stack, "up", up)
    return asked


def test_the_only_table_of_a_template_is_taken(
    started: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    template = EXAMPLES / "users" / "template.yaml"
    code, _, err = tally(capsys, "local", "up", "--template", str(template))
    assert started["table_id"] == "UsersTable", err
    assert code == 1 and "not started in this test" in err


def test_a_template_with_a_transform_is_read(
    tmp_path: Path, started: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    body = (EXAMPLES / "users" / "template.yaml").read_text()
    transform = "Tags: !Transform {Name: TeamTags, Parameters: {Team: users}}"
    template = tmp_path / "template.yaml"
    template.write_text(
        body.replace("      BillingMode:", f"      {transform}\n      BillingMode:")
    )
    code, _, err = tally(capsys, "local", "up", "--template", str(template))
    assert started["table_id"] == "UsersTable", err
    assert code == 1 and "not started in this test" in err


def test_several_tables_are_listed(
    started: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tally(capsys, "local", "up", "--template", str(ROOT_TEMPLATE))
    assert code == 2
    assert "--table-id" in err and "AuditTable" in err and "Table" in err
    assert not started


def test_a_table_id_the_template_lacks_is_a_usage_error_listing_its_tables(
    started: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    template = EXAMPLES / "users" / "template.yaml"
    code, _, err = tally(capsys, "local", "up", "--template", str(template), "--table-id", "Nope")
    assert code == 2
    assert "'Nope'" in err and "UsersTable" in err
    assert not started


def test_a_template_without_a_table_is_a_usage_error(
    tmp_path: Path, started: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    template = tmp_path / "template.yaml"
    template.write_text("Resources:\n  Topic:\n    Type: AWS::SNS::Topic\n")
    code, _, err = tally(capsys, "local", "up", "--template", str(template))
    assert code == 2 and "no AWS::DynamoDB::Table" in err
    assert not started


NO_STACK = "tally: the local stack is not running"


@pytest.mark.parametrize(
    "command",
    [
        ["rules", "check"],
        ["rules", "suggest"],
        ["pump"],
        ["alerts"],
        ["audit"],
        ["export", "--out", "exports"],
        ["replay"],
    ],
)
def test_every_command_without_a_stack_says_so_with_exit_1(
    command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No region either: the missing stack is what the user is told about, not the region.
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    code, out, err = tally(capsys, *command)
    assert code == 1, err
    assert err.startswith(NO_STACK), err
    assert "tally local up" in err
    assert out == ""


def test_a_writer_event_given_to_the_reconciler_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    event = ROOT_TEMPLATE.parent / "events" / "WriterFunction" / "api_add_child.json"
    code, _, err = tally(capsys, "invoke", "ReconcilerFunction", str(event))
    assert code == 2
    assert "not a DynamoDB stream event" in err and "HTTP API" in err, err


@pytest.mark.parametrize(
    "event", sorted((ROOT_TEMPLATE.parent / "events").glob("*/*.json")), ids=lambda p: p.name
)
def test_every_sample_event_fits_its_function(event: Path) -> None:
    from tally.local.functions import function
    from tally.local.template import load_template

    spec = function(load_template(ROOT_TEMPLATE), event.parent.name)
    local_commands._event_fits(spec, local_commands._event(event), event)


@pytest.mark.parametrize("action", ["load", "fault"])
def test_examples_need_the_local_stack(action: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = tally(capsys, "examples", action, "social")
    assert code == 1 and err.startswith(NO_STACK) and "tally local up" in err


def test_an_unknown_example_lists_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = tally(capsys, "examples", "load", "nope")
    assert code == 2 and "social" in err and "orders" in err and "projects" in err


@pytest.mark.parametrize("action", ["filter", "check", "suggest"])
def test_rules_subcommands_describe_themselves_and_their_exit_codes(
    action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = tally(capsys, "rules", action, "--help")
    assert code == 0
    _, _, rest = out.partition("\n\n")
    assert rest.split("\n")[0] and not rest.startswith("options:"), out  # a description
    assert cli.EPILOG in out


def test_export_says_one_whole_sentence_and_prints_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tally.cli import targets
    from tally.local import exports

    class Done:
        item_count = 3
        directory = tmp_path / "out" / "AWSDynamoDB" / "01"

    monkeypatch.setattr(targets, "item_count", lambda: 3)
    monkeypatch.setattr(exports, "export_table", lambda out, **_: Done())
    monkeypatch.setenv("TABLE_NAME", "t")
    code, out, err = tally(capsys, "export", "--out", str(tmp_path / "out"))
    assert code == 0 and out.strip() == str(Done.directory)
    assert err.strip() == f"export: 3 items written to {Done.directory}"
