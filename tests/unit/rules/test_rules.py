"""Rules: documents classify keys of any key schema; bad files name the rule and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.rules import CountRule, RuleSet, RulesFileError, SequenceRule, load_rules, parse_rules
from tally.rules.key_patterns import Pattern

SRC_RULES = Path(__file__).resolve().parents[3] / "src" / "rules.toml"


def likes(**overrides: Any) -> dict[str, Any]:
    rule = {
        "name": "likes",
        "kind": "count",
        "parent": {"PK": "POST#*", "SK": "META"},
        "children": {"SK": "LIKE#*"},
        "counter": "likeTally",
    }
    return rule | overrides


def issues(**overrides: Any) -> dict[str, Any]:
    rule = {
        "name": "issues",
        "kind": "sequence",
        "parent": {"PK": "PROJECT#*", "SK": "COUNTER#ISSUE"},
        "counter": "lastIssue",
        "members": {"layout": "collection", "SK": "ISSUE#*"},
    }
    return rule | overrides


def users(**overrides: Any) -> dict[str, Any]:
    rule = {
        "name": "users",
        "kind": "sequence",
        "parent": {"PK": "UserMetadata", "SK": "META"},
        "counter": "LastID",
        "members": {
            "layout": "index",
            "key": {"PK": "User#*"},
            "index": "SequenceIndex",
            "sequence_attribute": "seqName",
            "number": "NumIdentifier",
        },
    }
    return rule | overrides


def rejected(*rules: dict[str, Any]) -> str:
    with pytest.raises(RulesFileError) as error:
        parse_rules({"rules": list(rules)})
    return str(error.value)


def roles(rule_set: RuleSet, pk: str, sk: str) -> list[tuple[str, str, dict[str, str]]]:
    return [(m.rule.name, m.role, m.parent_key) for m in rule_set.classify({"PK": pk, "SK": sk})]


def sequence(rule_set: RuleSet, name: str) -> SequenceRule:
    rule = rule_set[name]
    assert isinstance(rule, SequenceRule)
    return rule


def as_toml(document: dict[str, Any]) -> str:
    """A rules document as TOML (flat tables and inline tables are all the tests need)."""
    lines = []
    for section, body in document.items():
        entries = body if isinstance(body, list) else [body]
        for entry in entries:
            lines.append(f"[[{section}]]" if isinstance(body, list) else f"[{section}]")
            lines += [
                f"{k} = {json.dumps(v) if not isinstance(v, dict) else inline(v)}"
                for k, v in entry.items()
            ]
    return "\n".join(lines) + "\n"


def inline(table: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + " }"


# --- classification (a small document of the test's own) -----------------------------------


def order_total(**overrides: Any) -> dict[str, Any]:
    rule = {
        "name": "order-total",
        "kind": "sum",
        "parent": {"PK": "ORDER#*", "SK": "META"},
        "children": {"SK": "LINE#*"},
        "counter": "total",
        "summed": "amount",
    }
    return rule | overrides


@pytest.fixture
def model() -> RuleSet:
    return parse_rules({"rules": [likes(), order_total(), issues(), users()]})


def test_default_rules_file_is_the_bundled_src_rules_toml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RULES_FILE", raising=False)
    assert [r.name for r in load_rules()] == [r.name for r in load_rules(SRC_RULES)]


def test_rules_file_variable_is_the_default_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(as_toml({"rules": [likes(name="mine")]}), encoding="utf-8")
    monkeypatch.setenv("RULES_FILE", str(path))
    assert [r.name for r in load_rules()] == ["mine"]


def test_post_meta_is_the_parent_of_likes(model: RuleSet) -> None:
    meta = {"PK": "POST#a91f", "SK": "META"}
    assert roles(model, "POST#a91f", "META") == [("likes", "parent", meta)]


def test_like_is_a_child_of_its_post(model: RuleSet) -> None:
    meta = {"PK": "POST#a91f", "SK": "META"}
    assert roles(model, "POST#a91f", "LIKE#USER#7c20") == [("likes", "child", meta)]


def test_order_line_is_a_child_of_order_total(model: RuleSet) -> None:
    meta = {"PK": "ORDER#17", "SK": "META"}
    assert roles(model, "ORDER#17", "LINE#3") == [("order-total", "child", meta)]


def test_issue_is_a_member_of_its_projects_issue_numbers(model: RuleSet) -> None:
    counter = {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"}
    assert roles(model, "PROJECT#A", "ISSUE#0000000042") == [("issues", "member", counter)]
    assert sequence(model, "issues").member_number("ISSUE#0000000042") == 42


def test_user_profile_is_a_member_of_user_numbers(model: RuleSet) -> None:
    counter = {"PK": "UserMetadata", "SK": "META"}
    assert roles(model, "User#Kirk", "PROFILE") == [("users", "member", counter)]


def test_unknown_key_matches_no_rule(model: RuleSet) -> None:
    assert roles(model, "CART#9", "ITEM#1") == []
    assert roles(model, "POST#a91f", "COMMENT#1") == []


def test_collection_member_without_a_number_is_no_member(model: RuleSet) -> None:
    assert roles(model, "PROJECT#A", "ISSUE#draft") == []
    assert sequence(model, "issues").member_number("ISSUE#draft") is None


def test_member_number_of_a_non_ascii_digit_suffix_is_none(model: RuleSet) -> None:
    assert roles(model, "PROJECT#A", "ISSUE#²") == []
    assert sequence(model, "issues").member_number("ISSUE#²") is None


# --- bad files ----------------------------------------------------------------------------


def test_unknown_field_is_named() -> None:
    message = rejected(likes(countr="likeTally"))
    assert "'likes'" in message and "'countr'" in message


def test_missing_counter_is_named() -> None:
    rule = likes()
    del rule["counter"]
    message = rejected(rule)
    assert "'likes'" in message and "'counter'" in message and "required" in message


def test_wrong_kind_is_named() -> None:
    message = rejected(likes(kind="tally"))
    assert "'likes'" in message and "'kind'" in message and "'tally'" in message


def test_bad_repair_mode_is_named() -> None:
    message = rejected(likes(repair="sometimes"))
    assert "'likes'" in message and "'repair'" in message


def test_star_inside_a_pattern_can_never_match() -> None:
    message = rejected(likes(parent={"PK": "POST#*#x", "SK": "META"}))
    assert "'likes'" in message and "'parent'" in message and "can never match" in message


def test_empty_key_value_is_rejected() -> None:
    message = rejected(likes(parent={"PK": "", "SK": "META"}))
    assert "'likes'" in message and "'parent'" in message and "empty" in message


def test_pattern_naming_a_non_key_attribute_is_rejected() -> None:
    message = rejected(likes(parent={"PK": "POST#*", "SK": "META", "owner": "x"}))
    assert "'likes'" in message and "'parent'" in message and "'owner'" in message


def test_children_with_an_exact_sort_key_are_rejected() -> None:
    message = rejected(likes(children={"SK": "LIKE"}))
    assert "'likes'" in message and "'children'" in message and "prefix" in message


def test_parent_with_a_prefix_sort_key_is_rejected() -> None:
    message = rejected(likes(parent={"PK": "POST#*", "SK": "META*"}))
    assert "'likes'" in message and "'parent'" in message and "exact" in message


def test_overlapping_children_of_two_rules_are_rejected() -> None:
    narrower = likes(name="user-likes", children={"SK": "LIKE#USER#*"}, counter="userLikes")
    message = rejected(likes(), narrower)
    assert "'user-likes'" in message and "'children'" in message and "'likes'" in message


def test_children_overlapping_another_rules_parent_are_rejected() -> None:
    other = likes(name="pinned", parent={"PK": "POST#*", "SK": "LIKE#PINNED"}, counter="n")
    other["children"] = {"SK": "PIN#*"}
    message = rejected(likes(), other)
    assert "rule 'likes' field 'children'" in message and "parent of rule 'pinned'" in message


def test_children_overlapping_a_parent_message_says_child() -> None:
    other = likes(name="pinned", parent={"PK": "POST#*", "SK": "LIKE#PINNED"}, counter="n")
    other["children"] = {"SK": "PIN#*"}
    assert re.search(r"both parent and child\b", rejected(likes(), other))


def test_two_rules_on_one_parent_cannot_share_a_counter() -> None:
    bookmarks = likes(name="bookmarks", children={"SK": "BOOKMARK#*"})
    message = rejected(likes(), bookmarks)
    assert "'bookmarks'" in message and "'counter'" in message and "'likeTally'" in message


def test_two_rules_on_one_parent_may_share_a_revision() -> None:
    bookmarks = likes(name="bookmarks", children={"SK": "BOOKMARK#*"}, counter="bookmarkTally")
    rule_set = parse_rules({"rules": [likes(revision="rev"), bookmarks | {"revision": "rev"}]})
    parent = [m.rule.name for m in rule_set.classify({"PK": "POST#1", "SK": "META"})]
    assert parent == ["likes", "bookmarks"]


def test_collection_members_need_a_prefix_sort_key() -> None:
    message = rejected(issues(members={"layout": "collection", "SK": "ISSUE#"}))
    assert "'issues'" in message and "'members.SK'" in message and "prefix" in message


@pytest.mark.parametrize("grace", [-1, 901])
def test_grace_seconds_out_of_range_is_rejected(grace: int) -> None:
    message = rejected(issues(grace_seconds=grace))
    assert "'issues'" in message and "'grace_seconds'" in message


def test_a_counter_kept_by_an_aggregator_declares_its_lag() -> None:
    aggregated = parse_rules({"rules": [likes(repair="alert", lag_seconds=60)]})["likes"]
    plain = parse_rules({"rules": [likes()]})["likes"]
    assert isinstance(aggregated, CountRule) and isinstance(plain, CountRule)
    assert (aggregated.lag_seconds, plain.lag_seconds) == (60, None)


@pytest.mark.parametrize("lag", [0, -1, 901, "soon", 1.5])
def test_lag_seconds_out_of_range_is_rejected(lag: Any) -> None:
    message = rejected(likes(repair="alert", lag_seconds=lag))
    assert "'likes'" in message and "'lag_seconds'" in message


@pytest.mark.parametrize(
    ("setting", "why"),
    [({"repair": "auto"}, "race"), ({"on_ttl_expiry": "decrement"}, "twice")],
)
def test_an_aggregated_counter_is_never_written_by_the_reconciler(
    setting: dict[str, str], why: str
) -> None:
    message = rejected(likes(lag_seconds=60) | {"repair": "alert"} | setting)
    assert "'likes'" in message and "'lag_seconds'" in message and why in message


def test_sequences_have_no_lag() -> None:
    message = rejected(issues(lag_seconds=60))
    assert "'issues'" in message and "lag_seconds" in message


def test_index_layout_needs_an_exact_counter_key() -> None:
    message = rejected(users(parent={"PK": "UserMetadata*", "SK": "META"}))
    assert "'users'" in message and "'parent'" in message and "exact" in message


def test_collection_sequence_without_table_sort_key_is_a_rules_file_error() -> None:
    raw = {"table": {"partition_key": "PK"}, "rules": [issues(parent={"PK": "PROJECT#*"})]}
    with pytest.raises(RulesFileError, match=r"'members'.*needs a table sort key"):
        parse_rules(raw)


def test_bad_rule_in_a_toml_file_names_file_rule_and_field(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        '[[rules]]\nname = "likes"\nkind = "count"\nparent = { PK = "POST#*", SK = "META" }\n'
        'children = { SK = "LIKE#*" }\ncountr = "likeTally"\n',
        encoding="utf-8",
    )
    with pytest.raises(RulesFileError) as error:
        load_rules(path)
    message = str(error.value)
    assert str(path) in message and "'likes'" in message and "'countr'" in message


def test_invalid_toml_syntax_is_a_rules_file_error(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text('[[rules]]\nname = "likes\n', encoding="utf-8")
    with pytest.raises(RulesFileError, match=r"rules\.toml"):
        load_rules(path)


def test_missing_rules_file_is_a_rules_file_error(tmp_path: Path) -> None:
    with pytest.raises(RulesFileError, match=r"absent\.toml"):
        load_rules(tmp_path / "absent.toml")


# --- patterns -----------------------------------------------------------------------------

text = st.text(alphabet=st.characters(blacklist_characters="*"), max_size=12)
pattern_text = st.one_of(text.filter(bool), text.map(lambda t: t + "*"))


@given(prefix=text, suffix=text)
def test_a_prefix_pattern_matches_everything_it_starts(prefix: str, suffix: str) -> None:
    assert Pattern.parse(prefix + "*").matches(prefix + suffix)


@given(a=pattern_text, b=pattern_text)
def test_overlaps_is_symmetric(a: str, b: str) -> None:
    first, second = Pattern.parse(a), Pattern.parse(b)
    assert first.overlaps(second) == second.overlaps(first)


_ROOT = Path(__file__).resolve().parents[3]
_RULE_FILES = sorted(
    [_ROOT / "src" / "rules.toml", *(_ROOT / "examples" / "adopting").glob("*/rules.toml")]
)
_HEADS = ["POST", "ORDER", "PROJECT", "User", "UserMetadata", "USER", "CART", "", "9", "P"]
_TAILS = ["", "#", "#a91f", "#12", "#0007", "Metadata", "#META#1"]


@pytest.mark.parametrize("rules_file", _RULE_FILES, ids=lambda p: p.parent.name)
@given(
    head=st.sampled_from(_HEADS),
    tail=st.sampled_from(_TAILS) | st.text(max_size=6),
    sort=st.sampled_from(["META", "LIKE#USER#1", "ISSUE#0000000003", "COUNTER#ISSUE", "0", "7"])
    | st.text(max_size=6),
)
def test_classify_looks_only_where_a_rule_can_match(
    rules_file: Path, head: str, tail: str, sort: str
) -> None:
    """Rules are looked up by the partition key's head; every rule is still found."""
    rules = load_rules(rules_file)
    table = rules.table
    key = {table.partition_key: head + tail}
    if table.sort_key is not None:
        key[table.sort_key] = sort
    everywhere = load_rules(rules_file)
    everywhere.classify(key)  # compiles; then every rule is a candidate for every key
    everywhere._by_head, everywhere._any_head = {}, list(everywhere._compiled or [])
    found = [(m.rule.name, m.role, m.parent_key) for m in rules.classify(key)]
    assert found == [(m.rule.name, m.role, m.parent_key) for m in everywhere.classify(key)]
