"""``tally completion SHELL`` prints a static completion script generated from the parser:
every command and action completes in bash, paths complete as files, and a shell it does
not know is a usage error (exit 2), never a traceback."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import shtab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.cli import app as cli


def levels(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], set[str]]]:
    """Every level of the command line that takes a command or action: the words before it,
    and the names the parser accepts there."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield words, set(action.choices)
            for name, child in action.choices.items():
                yield from levels(child, (*words, name))


def tally(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(args))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def completed(script: Path, cwd: Path, *words: str) -> set[str]:
    """What bash offers for the last of ``words`` (the word being completed) after
    ``tally`` and the words before it."""
    line = " ".join(f"'{w}'" for w in ("tally", *words))
    shown = subprocess.run(
        [
            "bash",
            "--norc",
            "--noprofile",
            "-c",
            f'source "{script}"; COMP_WORDS=({line}); COMP_CWORD={len(words)}; '
            '_shtab_tally; printf "%s\\n" "${COMPREPLY[@]}"',
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(shown.stdout.split())


@pytest.fixture
def bash_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    code, out, err = tally(capsys, "completion", "bash")
    assert (code, err) == (0, "")
    script = tmp_path / "tally.bash"
    script.write_text(out)
    return script


def test_bash_completes_every_command_and_action_the_parser_has(
    bash_script: Path, tmp_path: Path
) -> None:
    found = list(levels(cli._parser()))
    assert len(found) >= 4  # tally's commands, and the actions of local, rules, examples
    for words, names in found:
        assert completed(bash_script, tmp_path, *words, "") == names, words


def test_bash_completes_a_path_option_with_files(bash_script: Path, tmp_path: Path) -> None:
    (tmp_path / "my-rules.toml").write_text("")
    assert "my-rules.toml" in completed(bash_script, tmp_path, "audit", "--rules", "my")


@pytest.mark.parametrize("shell", shtab.SUPPORTED_SHELLS)
def test_every_shell_gets_a_script_naming_every_command(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = tally(capsys, "completion", shell)
    assert (code, err) == (0, "")
    [(_, commands), *_] = levels(cli._parser())
    assert all(name in out for name in commands)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shell=st.text(max_size=12).filter(lambda s: s not in shtab.SUPPORTED_SHELLS))
def test_a_shell_tally_cannot_complete_for_is_a_usage_error(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = tally(capsys, "completion", shell)
    assert code == 2 and out == ""
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("tally completion: error: "), err
