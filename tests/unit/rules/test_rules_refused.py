"""Rules that can never work are refused at load, by every loader, in one line per problem
naming the rule and the clash: a name twice, a counter on a key or TTL attribute, a revision
that is the counter, a name too long to use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tally.cli import app as cli
from tally.local.functions import cold_start, function
from tally.local.template import load_template, template_path
from tally.rules import MAX_NAME_LENGTH, RulesFileError, load_rules, parse_rules
from tests.unit.rules.test_rules import as_toml, issues, likes


def refusal(document: dict[str, Any]) -> list[str]:
    """The problem lines of the refusal (after the line naming the file)."""
    with pytest.raises(RulesFileError) as error:
        parse_rules(document)
    first, *problems = str(error.value).splitlines()
    assert first == "rules file <rules>:"
    return [line.strip() for line in problems]


def test_two_rules_with_the_same_name_are_refused() -> None:
    other = likes(parent={"PK": "PHOTO#*", "SK": "META"}, children={"SK": "FAVE#*"})
    assert refusal({"rules": [likes(), other]}) == [
        "rule 'likes' field 'name': another rule has this name (rule #1 and rule #2)"
    ]


def test_a_counter_equal_to_the_partition_or_sort_key_is_refused() -> None:
    for key in ("PK", "SK"):
        assert refusal({"rules": [likes(counter=key)]}) == [
            f"rule 'likes' field 'counter': {key!r} is a key attribute of the table; "
            "a counter cannot be one"
        ]
    table = {"partition_key": "pk", "sort_key": "sk"}
    rule = issues(
        parent={"pk": "PROJECT#*", "sk": "COUNTER#ISSUE"},
        members={"layout": "collection", "sk": "ISSUE#*"},
        counter="pk",
    )
    assert refusal({"table": table, "rules": [rule]}) == [
        "rule 'issues' field 'counter': 'pk' is a key attribute of the table; "
        "a counter cannot be one"
    ]


def test_a_revision_equal_to_the_counter_or_a_key_attribute_is_refused() -> None:
    assert refusal({"rules": [likes(revision="likeTally")]}) == [
        "rule 'likes' field 'revision': 'likeTally' is the rule's counter; "
        "the revision must be an attribute of its own"
    ]
    assert refusal({"rules": [likes(revision="SK")]}) == [
        "rule 'likes' field 'revision': 'SK' is a key attribute of the table; "
        "a revision cannot be one"
    ]


def test_the_ttl_attribute_equal_to_the_counter_or_revision_is_refused() -> None:
    table = {"partition_key": "PK", "sort_key": "SK", "ttl_attribute": "expiresAt"}
    assert refusal({"table": table, "rules": [likes(counter="expiresAt")]}) == [
        "rule 'likes' field 'counter': 'expiresAt' is the table's ttl_attribute "
        "(DynamoDB would delete the parent when the counter reads as a past time)"
    ]
    assert refusal({"table": table, "rules": [likes(revision="expiresAt")]}) == [
        "rule 'likes' field 'revision': 'expiresAt' is the table's ttl_attribute "
        "(DynamoDB would delete the parent when the revision reads as a past time)"
    ]


def test_a_name_of_100000_characters_is_refused_in_one_short_line() -> None:
    name = "x" * 100_000
    [line] = refusal({"rules": [likes(name=name)]})
    assert line == (
        f"rule 'xxxxxxxxxxxxxxxxxxxxxxxx...' (a name of 100000 characters) field 'name': "
        f"String should have at most {MAX_NAME_LENGTH} characters"
    )
    assert MAX_NAME_LENGTH == 64
    assert parse_rules({"rules": [likes(name="n" * MAX_NAME_LENGTH)]})


def test_a_long_rule_name_that_is_no_text_is_named_by_its_position() -> None:
    [line] = refusal({"rules": [likes(name=["x"] * 100)]})
    assert line.startswith("rule #1 field 'name': Input should be a valid string")


CLASHES = {
    "same name": [likes(), likes(parent={"PK": "PHOTO#*", "SK": "META"}, children={"SK": "F#*"})],
    "counter is PK": [likes(counter="PK")],
    "revision is the counter": [likes(revision="likeTally")],
    "name too long": [likes(name="x" * 100_000)],
}


def _write(tmp_path: Path, rules: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rules.toml"
    path.write_text(as_toml({"rules": rules}))
    return path


@pytest.mark.parametrize("clash", CLASHES)
def test_every_loader_refuses_them(
    clash: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _write(tmp_path, CLASHES[clash])
    with pytest.raises(RulesFileError):
        load_rules(path)

    # A Lambda cold start: the reconciler's own modules, with the function's environment.
    started = cold_start(
        function(load_template(template_path()), "ReconcilerFunction"), {"RULES_FILE": str(path)}
    )
    refused = started.modules["tally.rules"].RulesFileError
    monkeypatch.setenv("TABLE_NAME", "not-read")
    monkeypatch.setenv("RULES_FILE", str(path))
    with pytest.raises(refused):
        started.modules["tally.reconciler.runtime"].rules()

    # `tally rules filter` and `tally rules check` (before any table is read).
    monkeypatch.setenv("TALLY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("RULES_FILE")
    assert cli.main(["rules", "filter", "--rules", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tally: rules file {path}:")
    assert len(max(err.splitlines(), key=len)) < 250
    assert cli.main(["rules", "check", "--rules", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"flag: rules file {path}:") and "rule " in out
