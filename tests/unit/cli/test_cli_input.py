"""Hostile input on the command line is one line on stderr and exit code 2, never a traceback:
each cause met once, then every command's options with a table of hostile values each."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.cli import app as cli
from tally.cli import console, targets
from tally.cli.options import segment_count
from tally.local import demo, dynamodb_local
from tally.local import stack as local_stack
from tally.local.stack_record import LocalStackError
from tally.local.template import template_path

EVENT = str(template_path().parent / "events" / "ReconcilerFunction" / "like_added.json")
SRC_RULES = Path(__file__).resolve().parents[3] / "src" / "rules.toml"


@pytest.fixture(autouse=True)
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No local stack, nothing in the environment names a table, and AWS out of reach."""
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path / "state"))
    for name in ("TABLE_NAME", "AUDIT_TABLE_NAME", "ALERT_TOPIC_ARN", "RULES_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("DYNAMODB_ENDPOINT", raising=False)
    yield


def tally(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Exit code, stdout, stderr; SystemExit (argparse) counts as an exit code too."""
    try:
        code = cli.main(list(args))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, captured.out, captured.err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tally: ") or ": error: " in lines[0], err
    return lines[0]


# --- the five causes ------------------------------------------------------------------------


def test_a_deeply_nested_toml_rules_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "deep.toml"
    rules.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    code, out, err = tally(capsys, "rules", "filter", "--rules", str(rules))
    assert (code, out) == (2, "")
    assert one_line(err) == f"tally: rules file {rules}: nested too deeply to read"


def test_a_rules_file_that_is_not_utf8_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "latin1.toml"
    rules.write_bytes('[[rules]]\nname = "caf\u00e9"\n'.encode("latin-1"))
    code, _, err = tally(capsys, "rules", "filter", "--rules", str(rules))
    assert code == 2
    line = one_line(err)
    assert line == f"tally: rules file {rules}: not UTF-8 text (byte 0xe9 at offset 21)"


def test_a_rules_path_that_is_a_symlink_loop_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.toml").symlink_to(tmp_path / "b.toml")
    (tmp_path / "b.toml").symlink_to(tmp_path / "a.toml")
    for command in (["rules", "filter"], ["audit"], ["pump"], ["local", "up"]):
        code, _, err = tally(capsys, *command, "--rules", str(tmp_path / "a.toml"))
        assert code == 2, command
        assert one_line(err) == f"tally: --rules {tmp_path / 'a.toml'}: a symlink loop", command


def test_invoke_with_a_template_that_is_not_yaml_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template = tmp_path / "template.yaml"
    template.write_text("Resources:\n  Table: [unclosed\n")
    code, _, err = tally(capsys, "invoke", "--template", str(template), "ReconcilerFunction", EVENT)
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"tally: template {template}: not valid YAML (")
    assert "line 3" in line
    template.write_text("- a list\n- not a template\n")
    code, _, err = tally(capsys, "invoke", "--template", str(template), "ReconcilerFunction", EVENT)
    assert code == 2
    assert one_line(err) == f"tally: template {template}: not a CloudFormation template"


@pytest.mark.parametrize("port", ["99999", "0", "-1", "65536"])
def test_a_dynamodb_local_port_out_of_range_is_a_usage_error(
    port: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Any] = []
    monkeypatch.setattr(dynamodb_local.DynamoDBLocal, "start", lambda *a: started.append(a))
    code, _, err = tally(capsys, "dynamodb-local", "run", "--port", port)
    assert code == 2 and started == []
    assert f"argument --port: a port from 1 to 65535, not {port!r}" in err
    with pytest.raises(SystemExit) as done:
        dynamodb_local.main(["run", "--port", port])
    assert done.value.code == 2 and started == []
    assert f"argument --port: a port from 1 to 65535, not {port!r}" in capsys.readouterr().err


# --- pump options ---------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", ["-5", "nan", "0", "inf", "-inf", "0.0", "five"])
def test_pump_max_seconds_that_are_not_a_positive_time_are_a_usage_error(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tally(capsys, "pump", "--until-idle", f"--max-seconds={seconds}")
    assert code == 2
    assert f"argument --max-seconds: a number of seconds above 0, not {seconds!r}" in err


def test_pump_max_seconds_takes_a_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    options = cli._parser().parse_args(["pump", "--until-idle", "--max-seconds", "0.5"])
    assert options.max_seconds == 0.5


def test_pump_with_a_missing_rules_file_stops_before_looking_for_the_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.toml"
    code, _, err = tally(capsys, "pump", "--until-idle", "--rules", str(missing))
    assert (code, one_line(err)) == (2, f"tally: --rules {missing}: no such file")


def test_pump_with_a_broken_rules_file_stops_with_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "rules.toml"
    broken.write_text(SRC_RULES.read_text().replace('counter = "likeTally"', 'countr = "x"'))
    code, _, err = tally(capsys, "pump", "--until-idle", "--rules", str(broken))
    assert code == 2
    assert err.startswith(f"tally: rules file {broken}:") and "'countr'" in err


# --- every command's options, hostile values each --------------------------------------------


def hostile_paths(tmp_path: Path) -> list[str]:
    """Paths that are not what the option wants, each in its own way."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(b"caf\xe9 = 1\n")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 4)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    toml = tmp_path / "other.toml"
    toml.write_text("x = 1\n")
    empty = tmp_path / "empty"
    empty.write_text("")
    unreadable = tmp_path / "unreadable"
    unreadable.write_text("[[rules]]\n")
    unreadable.chmod(0)
    return [
        "",
        ".",
        "/",
        str(tmp_path),
        str(tmp_path / "none" / "x"),
        str(loop),
        str(loop / "below"),
        str(deep),
        str(latin),
        str(junk),
        str(listed),
        str(toml),
        str(empty),
        str(unreadable),
        "/dev/null",
        "x" * 300,
        "/" + "x/" * 3000,
        "-",
    ]


TEXT = ["", " ", "-", "--", "\u202e", "nope", "PK=", "=", "a" * 100_000, "\x7f", "\u00e9\u00e9"]
INT = ["0", "-1", "65536", "99999", "1e3", "nan", "", " 1", "9" * 5000, "\u0663", "\u00b2"]
FLOAT = ["nan", "inf", "-inf", "-5", "0", "1e309", "", "x", "1_000", "-0", "9" * 5000]
CHOICE = ["", "bogus", "UP", "-"]


def _value_kind(action: argparse.Action) -> str:
    if action.choices is not None:
        return "choice"
    if action.type is Path:
        return "path"
    if action.type is float or action.dest == "max_seconds":
        return "float"
    if action.type in (int, segment_count) or action.dest in ("port", "sample", "segments"):
        return "int"
    return "text"


def _commands() -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """Every leaf command (``rules check`` included) with its parser."""

    def walk(
        prefix: list[str], parser: argparse.ArgumentParser
    ) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers:
            yield prefix, parser
            return
        for name, child in subparsers[0].choices.items():
            yield from walk([*prefix, name], child)

    yield from walk([], cli._parser())


# A valid value for each positional and required option, so each option is reached alone.
VALID = {
    "action": {"local": "env", "dynamodb-local": "run"},
    "function": "ReconcilerFunction",
    "example": "social",
    "event": EVENT,
    "out": "OUT",
    "state": "off",
    "shell": "bash",
}


def _base(command: list[str], parser: argparse.ArgumentParser, out: Path) -> list[str]:
    args = list(command)
    for action in parser._actions:
        if action.option_strings and not action.required:
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        valid = VALID[action.dest]
        if isinstance(valid, dict):
            valid = valid[command[0]]
        if valid == "OUT":
            args += [action.option_strings[0], str(out)]
        else:
            args.append(valid)
    return args


def _cases(tmp_path: Path) -> list[list[str]]:
    values = {
        "path": hostile_paths(tmp_path),
        "text": TEXT,
        "int": INT,
        "float": FLOAT,
        "choice": CHOICE,
    }
    cases = []
    for command, parser in _commands():
        base = _base(command, parser, tmp_path / "out")
        cases.append(base)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.option_strings:  # a positional: hostile in its place
                kind = _value_kind(action)
                position = base.index(str(_positional_value(command, action)))
                for value in values[kind]:
                    cases.append([*base[:position], value, *base[position + 1 :]])
                continue
            if action.nargs == 0:
                cases.append([*base, action.option_strings[0]])
                continue
            for value in values[_value_kind(action)]:
                cases.append([*base, action.option_strings[0], value])
    return cases


def _positional_value(command: list[str], action: argparse.Action) -> str:
    valid = VALID[action.dest]
    return valid[command[0]] if isinstance(valid, dict) else valid


@pytest.fixture
def harmless(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing the fuzz runs may start processes, download, or reach AWS."""

    def no_ports(*_: Any, **__: Any) -> int:
        raise LocalStackError("(the fuzz starts no local stack)")

    def no_stack(name: str) -> dict[str, str]:
        raise console.Failure(f"(the fuzz reaches no stack {name[:20]!r})")

    monkeypatch.setattr(local_stack, "_reserve_port", no_ports)
    monkeypatch.setattr(targets, "deployed", no_stack)
    monkeypatch.setattr(demo, "run_demo", lambda *_, **__: 0)
    monkeypatch.setattr(dynamodb_local, "main", lambda *_: 0)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fuzz")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fuzz")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_every_commands_options_with_hostile_values_give_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], harmless: None
) -> None:
    cases = _cases(tmp_path)
    assert len(cases) > 300
    covered = {tuple(case[:2]) for case in cases}
    assert {("rules", "check"), ("dynamodb-local", "run"), ("pump", "--until-idle")} <= covered
    failures = []
    for case in cases:
        try:
            code, _, err = tally(capsys, *case)
        except BaseException as error:  # a traceback: what the fuzz is here to find
            capsys.readouterr()
            failures.append(f"{case!r:.200}: {type(error).__name__}: {error!s:.200}")
            continue
        if code not in (0, 1, 2):
            failures.append(f"{case!r:.200}: exit {code}")
        elif code and not err.strip():
            failures.append(f"{case!r:.200}: exit {code} with nothing on stderr")
    assert failures == [], "\n".join(failures)


OPTION_WORDS = sorted(
    {o for _, p in _commands() for a in p._actions for o in a.option_strings} | {"--"}
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    args=st.lists(
        st.one_of(
            st.sampled_from([c[0] for c, _ in _commands()]),
            st.sampled_from(OPTION_WORDS),
            st.sampled_from(TEXT[:-1] + INT + FLOAT),
            st.text(
                st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8
            ),
        ),
        max_size=6,
    )
)
def test_any_argument_list_is_a_message_and_exit_code(
    args: list[str], capsys: pytest.CaptureFixture[str], harmless: None
) -> None:
    code, _, _ = tally(capsys, *args)
    assert code in (0, 1, 2)
