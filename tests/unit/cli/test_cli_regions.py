"""The multi-Region options' mistakes are one line on stderr and exit 2, before anything
starts or is reached: Regions and lag `tally local up` cannot take, options given to the
wrong action, and ``--region`` naming a Region the recorded stack does not run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.cli import app as cli
from tally.local import regions, stack
from tests.unit.local.test_regions import record, two_regions


@pytest.fixture(autouse=True)
def nothing_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state directory of its own; starting or probing a stack fails the test."""

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("a usage mistake reached the stack")

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    monkeypatch.setenv("TALLY_STATE_DIR", str(state_dir))
    monkeypatch.delenv("RULES_FILE", raising=False)
    monkeypatch.setattr(regions, "up", refused)
    monkeypatch.setattr(stack, "up", refused)
    monkeypatch.setattr(stack, "answers", refused)
    yield state_dir


def tally(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        code = cli.main(list(args))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--regions", "us-east-1"], "two Regions or more"),
        (["--regions", "us-east-1,us-east-1"], "us-east-1 given twice"),
        (["--regions", "us-east-1,mars-1"], "'mars-1': not an AWS Region DynamoDB runs in"),
        (["--regions", "us-east-1,eu-west-1", "--lag-ms", "-1"], "milliseconds from 0"),
        (["--regions", "us-east-1,eu-west-1", "--lag-ms", "soon"], "milliseconds from 0"),
        (["--lag-ms", "100"], "--lag-ms, --skew-ms and --consistency go with --regions"),
        (["--consistency", "strong"], "--lag-ms, --skew-ms and --consistency go with --regions"),
        (["--skew-ms", "eu-west-1=5"], "--lag-ms, --skew-ms and --consistency go with --regions"),
        (["--regions", "us-east-1,eu-west-1", "--skew-ms", "eu-west-1"], "REGION=MS pairs"),
        (["--regions", "us-east-1,eu-west-1", "--skew-ms", "eu-west-1=1e9"], "REGION=MS pairs"),
        (["--regions", "us-east-1,eu-west-1", "--skew-ms", "eu-west-1=99999"], "to 60000"),
        (["--regions", "us-east-1,eu-west-1", "--skew-ms", "ap-east-1=5"], "not one of the"),
        (
            [
                *("--regions", "us-east-1,eu-west-1,ap-southeast-2"),
                *("--consistency", "strong", "--skew-ms", "eu-west-1=5"),
            ],
            "no last writer to skew",
        ),
        (
            ["--regions", "us-east-1,eu-west-1", "--consistency", "strong"],
            "exactly three Regions, not 2",
        ),
        (
            [
                *("--regions", "us-east-1,eu-west-1,ap-southeast-2"),
                *("--consistency", "strong", "--lag-ms", "5"),
            ],
            "has no replication lag to set",
        ),
    ],
)
def test_up_refuses_regions_it_cannot_run(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = tally(capsys, "local", "up", *args)
    assert code == 2 and said in err, err


@pytest.mark.parametrize("action", ["down", "env"])
def test_the_options_of_up_given_to_another_action_say_where_they_go(
    action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for option in (["--regions", "us-east-1,eu-west-1"], ["--lag-ms", "5"], ["--skew-ms", "a=1"]):
        code, err = tally(capsys, "local", action, *option)
        assert code == 2 and "go with `tally local up`" in err, err


@pytest.mark.parametrize("command", [["local", "env"], ["pump"]])
def test_region_on_a_single_region_stack_is_a_usage_error(
    command: list[str], nothing_starts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record(nothing_starts).save()
    code, err = tally(capsys, *command, "--region", "eu-west-1")
    assert code == 2, err
    assert err.strip() == (
        "tally: --region eu-west-1: the local stack runs one Region (us-east-1); "
        "`tally local up --regions A,B` starts several"
    )


@pytest.mark.parametrize("command", [["local", "env"], ["pump"]])
def test_a_region_the_stack_does_not_run_is_a_usage_error_naming_its_regions(
    command: list[str], nothing_starts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    two_regions(nothing_starts).save()
    code, err = tally(capsys, *command, "--region", "ap-south-1")
    assert code == 2, err
    assert err.strip() == (
        "tally: --region ap-south-1: the local stack runs us-east-1, eu-west-1, not ap-south-1"
    )
