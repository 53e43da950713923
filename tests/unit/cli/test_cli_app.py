"""The CLI's mistakes are messages and exit codes (0 clean, 1 findings or failure, 2 usage),
never tracebacks: each case as an operator meets it, with no AWS and no local stack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.cli import app as cli
from tally.cli import targets
from tally.cli.options import parse_key
from tally.local.template import template_path

EVENT = str(template_path().parent / "events" / "ReconcilerFunction" / "like_added.json")


@pytest.fixture(autouse=True)
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No local stack, and nothing in the environment names a table."""
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path / "state"))
    for name in ("TABLE_NAME", "AUDIT_TABLE_NAME", "ALERT_TOPIC_ARN", "RULES_FILE"):
        monkeypatch.delenv(name, raising=False)
    yield


def tally(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Exit code, stdout, stderr; SystemExit (argparse) counts as an exit code too."""
    try:
        code = cli.main(list(args))
    except SystemExit as done:
        code = int(done.code or 0)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("parent", "message"),
    [
        ("PK=POST#a91f", "--parent lacks SK"),
        ("PK=POST#a91f;SK=META", "--parent lacks SK"),
        ("pk=POST#a91f,sk=META", "--parent lacks PK, SK"),
        ("PK=POST#a91f,SK=META,X=1", "X is not a key attribute (PK, SK)"),
        ("PK=POST#a91f, SK=META", "' SK' is not an attribute name (no spaces"),
        ("PK=POST#a91f,SK= META", "the value of SK, ' META', starts or ends with a space"),
        ("PK=POST#a91f,SK=", "SK has no value"),
        ("PK=POST#a91f,PK=POST#b", "PK is given twice"),
        ("POST#a91f", "'POST#a91f' is not NAME=VALUE"),
        ("PK=NOTE#1,SK=META", "PK=NOTE#1,SK=META is the parent of no rule; the rules: likes"),
    ],
)
def test_a_malformed_parent_is_a_usage_error(
    parent: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = tally(capsys, "audit", "--parent", parent)
    assert code == 2
    assert message in err, err
    assert out == ""


def test_a_parent_of_another_rule_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = tally(capsys, "audit", "--rule", "likes", "--parent", "PK=ORDER#1,SK=META")
    assert code == 2
    assert "PK=ORDER#1,SK=META is not a parent of rule 'likes' (PK=POST#*,SK=META)" in err


def test_an_unknown_rule_lists_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = tally(capsys, "audit", "--rule", "nope")
    assert code == 2
    assert "no rule named 'nope'; the rules: likes (PK=POST#*,SK=META); order-total" in err


@pytest.mark.parametrize("segments", ["0", "-1", "65", "four"])
def test_segments_out_of_range_are_a_usage_error(
    segments: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tally(capsys, "audit", "--segments", segments)
    assert code == 2
    assert f"argument --segments: a whole number from 1 to 64, not {segments!r}" in err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "the following arguments are required: --out"),
        (["--out", "x", "--segments", "0"], "a whole number from 1 to 64, not '0'"),
    ],
)
def test_export_s_mistakes_are_usage_errors(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tally(capsys, "export", *arguments)
    assert code == 2
    assert message in err, err


def test_export_without_a_target_says_how_to_name_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tally(capsys, "export", "--out", str(tmp_path / "out"))
    assert code == 1
    assert "the local stack is not running and TABLE_NAME is not set" in err
    assert "tally local up" in err
    assert not (tmp_path / "out").exists()


def test_a_broken_rules_file_is_an_input_error_naming_the_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[table]\npartition_key = "PK"\n[[rules]]\nname = "likes"\nkind = "count"\n')
    code, _, err = tally(capsys, "audit", "--rules", str(rules))
    assert code == 2
    assert err.startswith(f"tally: rules file {rules}:")
    assert "rule 'likes' field" in err


def test_a_missing_rules_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tally(capsys, "audit", "--rules", str(tmp_path / "none.toml"))
    assert (code, err.strip()) == (2, f"tally: --rules {tmp_path / 'none.toml'}: no such file")


def test_no_target_says_how_to_name_one_and_never_prints_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOME_SECRET", "hunter2-do-not-print")
    code, _, err = tally(capsys, "audit")
    assert code == 1
    assert "the local stack is not running and TABLE_NAME is not set" in err
    assert "tally local up" in err and "--stack NAME" in err
    assert "hunter2" not in err


@pytest.mark.parametrize(
    "command", [["pump"], ["alerts"], ["local", "env"], ["local", "env", "--sam"]]
)
def test_commands_that_need_the_local_stack_say_how_to_start_it(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tally(capsys, *command)
    assert code == 1
    assert err.strip() == "tally: the local stack is not running: start it with `tally local up`"


def test_invoke_names_the_functions_when_one_is_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = tally(capsys, "invoke", "NopeFunction", EVENT)
    assert code == 2
    assert "no function 'NopeFunction' in" in err
    assert (
        "ReconcilerFunction, RecheckFunction, AuditFunction, AuditQueryFunction, "
        "AuditCandidatesFunction, WriterFunction" in err
    )


def test_invoke_with_a_missing_or_broken_event_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.json"
    code, _, err = tally(capsys, "invoke", "ReconcilerFunction", str(missing))
    assert (code, err.strip()) == (2, f"tally: event file {missing}: No such file or directory")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    code, _, err = tally(capsys, "invoke", "ReconcilerFunction", str(broken))
    assert code == 2 and f"tally: event file {broken} is not JSON:" in err
    broken.write_text("[1, 2]")
    code, _, err = tally(capsys, "invoke", "ReconcilerFunction", str(broken))
    assert code == 2 and "holds list, not a JSON object" in err


def test_no_template_in_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TALLY_TEMPLATE")
    monkeypatch.chdir(tmp_path)
    code, _, err = tally(capsys, "invoke", "ReconcilerFunction", EVENT)
    assert code == 2
    assert f"no template.yaml in {tmp_path}: run tally in the project's directory" in err
    code, _, err = tally(capsys, "alerts", "--template", str(tmp_path / "t.yaml"))
    assert (code, err.strip()) == (2, f"tally: --template {tmp_path / 't.yaml'}: no such file")


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = tally(capsys, "--version")
    assert code == 0 and out.startswith("tally ") and out.split()[1][0].isdigit()
    code, out, _ = tally(capsys, "--help")
    assert code == 0
    for command in ("local", "pump", "audit", "export", "alerts", "replay", "invoke", "demo"):
        assert f"    {command}" in out
    assert "exit codes: 0 clean, 1 findings or failure, 2 usage" in out
    code, out, _ = tally(capsys, "audit", "--help")
    assert code == 0 and "--parent KEY" in out and "PK=POST#a91f,SK=META" in out


def test_the_preflight_gives_up_in_seconds() -> None:
    """An unreachable endpoint costs two short connection attempts, not minutes of retries."""
    assert targets.PREFLIGHT.connect_timeout <= 2
    assert targets.PREFLIGHT.retries == {"mode": "standard", "total_max_attempts": 2}


text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@given(text)
def test_any_parent_text_parses_or_is_refused_with_a_message(value: str) -> None:
    try:
        key = parse_key(value)
    except ValueError as error:
        assert str(error)
    else:
        assert all(name and value for name, value in key.items())


names = st.text(
    st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"), min_size=1
)
values = st.text(st.characters(exclude_characters=",", exclude_categories=["Cs"]), min_size=1)


@given(st.dictionaries(names, values.filter(lambda v: v == v.strip()), min_size=1, max_size=4))
def test_a_written_key_parses_back(key: dict[str, str]) -> None:
    written = ",".join(f"{name}={value}" for name, value in key.items())
    assert parse_key(written) == key


def test_local_actions_are_subcommands_with_their_own_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = tally(capsys, "local", "--help")
    assert code == 0
    for action in ("up", "down", "env"):
        assert f"    {action} " in out, out
    own = {
        "up": ["--template PATH", "--table-id ID", "--rules PATH"],
        "down": [],
        "env": ["--sam"],
    }
    for action, options in own.items():
        code, out, _ = tally(capsys, "local", action, "--help")
        assert code == 0 and "exit codes: 0 clean, 1 findings or failure, 2 usage" in out
        for option in ("--template", "--table-id", "--rules", "--sam"):
            shown = any(o.startswith(option) for o in options)
            assert (f"  {option}" in out) == shown, (action, option, out)


@pytest.mark.parametrize(
    "args",
    [
        ["local", "down", "--sam"],
        ["local", "up", "--sam"],
        ["local", "env", "--rules", "src/rules.toml"],
        ["local", "down", "--table-id", "Table"],
        ["local"],
    ],
)
def test_an_option_of_another_local_action_is_a_usage_error(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tally(capsys, *args)
    assert code == 2 and err.strip(), err


def test_docs_local_shows_each_local_action_s_usage(capsys: pytest.CaptureFixture[str]) -> None:
    shown = (template_path().parent / "docs" / "local.md").read_text()
    for action in ("up", "down", "env"):
        _, out, _ = tally(capsys, "local", action, "--help")
        usage = " ".join(out.split("\n\n")[0].split())  # argparse wraps long usage lines
        assert f"\n{usage}\n" in shown, usage
