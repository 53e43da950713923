"""The full audit of children found through an index (``through`` rules), by the base table.

The export query (Athena's text, run by DuckDB transpiled) and the scan engine's gathering
count each child for the parent its index key names, if the index can hold it; items keyed
as children that the index cannot hold are ``unindexed``. A property test holds both to a
plain count and sum over random items: re-parented edges, other statuses, sparse and
malformed index keys, amounts that are not numbers.
"""

from __future__ import annotations

import base64
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from boto3.dynamodb.types import Binary
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.audit.athena_plan import plan
from tally.audit.candidates import Candidate, parse_candidate
from tally.audit.scan import _disagrees, _Indexed
from tally.audit.sql import EXACT_AMOUNT, AuditQuery
from tally.audit.unindexed import finding, index_key_types, unindexed
from tally.core.dynamodb import deserialize
from tally.local.athena_sql import check, to_duckdb
from tally.local.audit_duckdb import candidates
from tally.local.exports import read_export
from tally.rules import CountRule, SumRule, parse_rules
from tests.harness.index_tables import FOLLOWERS as FOLLOWERS_RULE
from tests.unit.audit.test_sql import DESCRIPTION, item, n, s
from tests.utils import write_aws_export

RULES = parse_rules(
    {
        "rules": [
            # followers: an edge keyed by the follower names its followee in GSI1PK
            FOLLOWERS_RULE | {"repair": "alert"},
            {  # a product's total quantity across every cart: an inverted index (SK, PK)
                "name": "product-totals",
                "kind": "sum",
                "parent": {"PK": "PRODUCT#*", "SK": "TOTALQUANTITY"},
                "children": {"PK": "CART#*", "SK": "PRODUCT#*"},
                "counter": "quantity",
                "summed": "quantity",
                "lag_seconds": 5,
                "through": {"index": "Inverted", "partition_key": "SK", "sort_key": "PK"},
            },
            {  # a team's members: an index sort key without a status, of any key type
                "name": "team-members",
                "kind": "count",
                "parent": {"PK": "TEAM#*", "SK": "META"},
                "children": {"PK": "USER#*", "SK": "MEMBER#*"},
                "counter": "memberCount",
                "through": {"index": "GSI2", "partition_key": "GSI2PK", "sort_key": "GSI2SK"},
            },
            {  # an ordinary rule beside them
                "name": "likes",
                "kind": "count",
                "parent": {"PK": "POST#*", "SK": "META"},
                "children": {"SK": "LIKE#*"},
                "counter": "likeTally",
            },
        ]
    }
)
KEYS = RULES.table


def edge(follower: str, followee: str, **index: Any) -> dict[str, Any]:
    return item(f"USER#{follower}", f"FOLLOWS#USER#{followee}", **index)


def following(followee: str) -> dict[str, Any]:
    return {"GSI1PK": s(f"USER#{followee}"), "GSI1SK": s("FOLLOWING#2026-11-26")}


def run(tmp_path: Path, items: list[dict[str, Any]]) -> dict[tuple[str, str, str], Candidate]:
    directory = write_aws_export(tmp_path, items)
    query = AuditQuery(list(RULES), KEYS)
    return {
        (c.rule, c.key["PK"], c.key["SK"]): c
        for c in candidates(query, read_export(directory), RULES)
    }


def gathered(items: list[dict[str, Any]]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """What the scan engine's gathering makes of ``items``: the parents it nominates (their
    scanned numbers disagree), and the items it finds out of the index."""
    indexed = _Indexed()
    for raw in items:
        # An export writes binaries base64; the scan's client hands over bytes.
        wire = {k: {"B": base64.b64decode(v["B"])} if "B" in v else v for k, v in raw.items()}
        image = deserialize(wire)
        for match in RULES.classify(image):
            target = match.rule
            if isinstance(target, CountRule | SumRule) and target.through is not None:
                indexed.add(target, match.role, image, KEYS, RULES.key_of(image))
    nominated = {
        (rule.name, key["PK"])
        for rule, key, seen in indexed.parents.values()
        if _disagrees(rule, seen)
    }
    return nominated, {(rule.name, key["PK"] + "/" + key["SK"]) for rule, key in indexed.unindexed}


def test_children_count_for_the_parent_their_index_key_names(tmp_path: Path) -> None:
    items = [
        # bob: two edges name him; one more names him under another status; one is re-parented
        # (its key says bob, its index key says cy): 2 followers, and his counter says 2.
        item("USER#bob", "PROFILE", followerCount=n(2)),
        edge("ann", "bob", **following("bob")),
        edge("dan", "bob", **following("bob")),
        edge("eve", "bob", GSI1PK=s("USER#bob"), GSI1SK=s("BLOCKED#2026")),
        edge("fay", "bob", **following("cy")),
        # cy: the re-parented edge is his; his counter says 0: drift.
        item("USER#cy", "PROFILE", followerCount=n(0)),
        # gone: followed, but no profile: orphans.
        edge("ann", "gone", **following("gone")),
        # An edge whose index key names no user (another rule's parent, say): no child.
        edge("ann", "team", GSI1PK=s("TEAM#x"), GSI1SK=s("FOLLOWING#1")),
        # Keyed as edges, but the index cannot hold them: unindexed, counted for nobody.
        edge("u1", "bob"),  # sparse: no index key at all
        edge("u2", "bob", GSI1PK=n(7), GSI1SK=s("FOLLOWING#1")),  # a number for an S key
        edge("u3", "bob", GSI1PK=s(""), GSI1SK=s("FOLLOWING#1")),  # empty
        edge("u4", "bob", GSI1PK=s("USER#bob")),  # no index sort key
        edge("u5", "bob", GSI1PK=s("USER#bob"), GSI1SK={"M": {}}),  # a map
        # Product totals across carts: 2 + 3 of product a (total 5: right); b says 9 for 1.
        item("PRODUCT#a", "TOTALQUANTITY", quantity=n(5)),
        item("CART#1", "PRODUCT#a", quantity=n(2)),
        item("CART#2", "PRODUCT#a", quantity=n(3)),
        item("PRODUCT#b", "TOTALQUANTITY", quantity=n(9)),
        item("CART#2", "PRODUCT#b", quantity=n(1)),
        # Teams: an index sort key of any key type counts; a map cannot be one.
        item("TEAM#t", "META", memberCount=n(2)),
        item("USER#ann", "MEMBER#t", GSI2PK=s("TEAM#t"), GSI2SK=n(1)),
        item("USER#bob", "MEMBER#t", GSI2PK=s("TEAM#t"), GSI2SK={"B": "AQ=="}),
        item("USER#cy", "MEMBER#t", GSI2PK=s("TEAM#t"), GSI2SK={"L": []}),
        # An ordinary rule is judged as before.
        item("POST#1", "META", likeTally=n(1)),
        item("POST#1", "LIKE#1"),
    ]
    found = run(tmp_path, items)
    problems = {where: c.problems for where, c in found.items()}
    unindexed_edges = {
        ("followers", f"USER#{u}", "FOLLOWS#USER#bob"): {"unindexed": 1}
        for u in ("u1", "u2", "u3", "u4", "u5")
    }
    assert problems == {
        ("followers", "USER#cy", "PROFILE"): {"drift": 1},
        ("followers", "USER#gone", "PROFILE"): {"orphans": 1},
        ("product-totals", "PRODUCT#b", "TOTALQUANTITY"): {"drift": 1},
        ("team-members", "USER#cy", "MEMBER#t"): {"unindexed": 1},
        **unindexed_edges,
    }
    cy = found["followers", "USER#cy", "PROFILE"]
    assert (cy.stored, cy.actual) == ("0", "1")
    gone = found["followers", "USER#gone", "PROFILE"]
    assert (gone.stored, gone.actual) == (None, "1")
    product = found["product-totals", "PRODUCT#b", "TOTALQUANTITY"]
    assert (product.stored, product.actual) == ("9", "1")
    assert found["followers", "USER#u1", "FOLLOWS#USER#bob"].stored is None

    # The scan engine's gathering nominates the same parents and finds the same items.
    nominated, outside = gathered(items)
    assert nominated == {
        ("followers", "USER#cy"),
        ("followers", "USER#gone"),
        ("product-totals", "PRODUCT#b"),
    }
    assert outside == {
        ("followers", f"USER#{u}/FOLLOWS#USER#bob") for u in ("u1", "u2", "u3", "u4", "u5")
    } | {("team-members", "USER#cy/MEMBER#t")}


# --- the query and the scan against a plain count, for random items -------------------------

PEOPLE = ["a", "b", "c", "d"]
# What an edge's index partition key holds: a user (maybe not the one its key names), another
# rule's parent, nothing, a number, an empty string.
named = st.one_of(
    st.sampled_from(PEOPLE).map(lambda p: ("user", p)),
    st.sampled_from([("team", "x"), ("absent", ""), ("number", "7"), ("empty", "")]),
)
status = st.sampled_from(["FOLLOWING#1", "FOLLOWING#", "BLOCKED#1", "", None, 5, "following#1"])
edges = st.lists(st.tuples(st.sampled_from(PEOPLE), st.sampled_from(PEOPLE), named, status))
counters = st.one_of(st.none(), st.integers(0, 5), st.just("text"))
profiles = st.lists(st.tuples(st.booleans(), counters), min_size=len(PEOPLE), max_size=len(PEOPLE))
amounts = st.one_of(
    st.builds(lambda u, p: Decimal(u).scaleb(-p), st.integers(-(10**6), 10**6), st.integers(0, 11)),
    st.just("text"),
    st.none(),
)
lines = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["a", "b"]), amounts), max_size=8)
totals = st.lists(
    st.tuples(st.booleans(), st.one_of(st.none(), st.integers(0, 9).map(Decimal), st.just("x"))),
    min_size=2,
    max_size=2,
)


def edge_items(
    edge_rows: list[tuple[str, str, tuple[str, str], Any]], profile_rows: list[tuple[bool, Any]]
) -> tuple[list[dict[str, Any]], set[str], set[str]]:
    """Items for followers; by a plain count, the profiles that are wrong, and the edges (as
    PK/SK) the index cannot hold."""
    items, outside, truth = [], set(), dict.fromkeys(PEOPLE, 0)
    seen = set()
    for follower, followee, (what, who), sk in edge_rows:
        key = (f"USER#{follower}", f"FOLLOWS#USER#{followee}")
        if key in seen:
            continue  # one item per key
        seen.add(key)
        index: dict[str, Any] = {}
        if what != "absent":
            index["GSI1PK"] = {
                "user": s(f"USER#{who}"),
                "team": s(f"TEAM#{who}"),
                "number": n(who),
                "empty": s(""),
            }[what]
        if sk is not None:
            index["GSI1SK"] = n(sk) if isinstance(sk, int) else s(sk)
        items.append(item(*key, **index))
        pk_held = what in ("user", "team")
        sk_held = isinstance(sk, str) and sk != ""
        if not (pk_held and sk_held):
            outside.add("/".join(key))
        elif what == "user" and sk.startswith("FOLLOWING#"):
            truth[who] += 1
    wrong = set()
    for person, (exists, counter) in zip(PEOPLE, profile_rows, strict=True):
        if exists:
            extra = {} if counter is None else {"followerCount": _value(counter)}
            items.append(item(f"USER#{person}", "PROFILE", **extra))
            if counter == "text" or (counter or 0) != truth[person]:
                wrong.add(f"USER#{person}")
        elif truth[person]:
            wrong.add(f"USER#{person}")
    return items, wrong, outside


def cart_items(
    line_rows: list[tuple[int, str, Any]], total_rows: list[tuple[bool, Any]]
) -> tuple[list[dict[str, Any]], set[str], set[str], set[str]]:
    """Items for product totals; the products that are wrong by a plain sum, those with an
    amount too fine to sum exactly, and those with an amount that is not a number."""
    items, truth = [], {"a": Decimal(0), "b": Decimal(0)}
    inexact, malformed, seen = set(), set(), set()
    for cart, product, amount in line_rows:
        key = (f"CART#{cart}", f"PRODUCT#{product}")
        if key in seen:
            continue
        seen.add(key)
        extra = {} if amount is None else {"quantity": _value(amount)}
        items.append(item(*key, **extra))
        if isinstance(amount, Decimal):
            truth[product] += amount
            if not re.match(EXACT_AMOUNT, n(amount)["N"]):
                inexact.add(f"PRODUCT#{product}")
        elif amount == "text":
            malformed.add(f"PRODUCT#{product}")
    wrong = set()
    for product, (exists, counter) in zip("ab", total_rows, strict=True):
        pk = f"PRODUCT#{product}"
        has_children = any(k[1] == f"PRODUCT#{product}" for k in seen)
        if exists:
            extra = {} if counter is None else {"quantity": _value(counter)}
            items.append(item(pk, "TOTALQUANTITY", **extra))
            if counter == "x" or (counter or Decimal(0)) != truth[product]:
                wrong.add(pk)
        elif has_children:
            wrong.add(pk)
    return items, wrong, inexact, malformed


# Team memberships: an index sort key without a status takes any key type (S, N, B).
TEAMS = ["t", "u"]
sort_values = st.sampled_from(
    [("S", "2026"), ("S", ""), ("N", "3"), ("B", "AQ=="), ("B", ""), ("M", None), None]
)
memberships = st.lists(
    st.tuples(st.sampled_from(PEOPLE), st.sampled_from([*TEAMS, "", None]), sort_values),
    max_size=8,
)
team_counters = st.lists(
    st.tuples(st.booleans(), st.one_of(st.none(), st.integers(0, 4))), min_size=2, max_size=2
)


def member_items(
    rows: list[tuple[str, str | None, Any]], team_rows: list[tuple[bool, int | None]]
) -> tuple[list[dict[str, Any]], set[str], set[str]]:
    """Items for team members; the teams wrong by a plain count, the items out of the index."""
    items, outside, seen, truth = [], set(), set(), dict.fromkeys(TEAMS, 0)
    for person, team, sort in rows:
        key = (f"USER#{person}", f"MEMBER#{len(seen)}")
        seen.add(key)
        index: dict[str, Any] = {}
        if team is not None:
            index["GSI2PK"] = s(f"TEAM#{team}" if team else "")
        if sort is not None:
            kind, value = sort
            index["GSI2SK"] = {"M": {}} if kind == "M" else {kind: value}
        items.append(item(*key, **index))
        held = sort is not None and sort[0] in ("S", "N", "B") and sort[1] != ""
        if not team or not held:
            outside.add("/".join(key))
        else:
            truth[team] += 1
    wrong = set()
    for team, (exists, counter) in zip(TEAMS, team_rows, strict=True):
        if exists:
            extra = {} if counter is None else {"memberCount": n(counter)}
            items.append(item(f"TEAM#{team}", "META", **extra))
            if (counter or 0) != truth[team]:
                wrong.add(f"TEAM#{team}")
        elif truth[team]:
            wrong.add(f"TEAM#{team}")
    return items, wrong, outside


def _value(value: Any) -> dict[str, str]:
    return s(value) if isinstance(value, str) else n(value)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    edge_rows=edges,
    profile_rows=profiles,
    line_rows=lines,
    total_rows=totals,
    member_rows=memberships,
    team_rows=team_counters,
)
def test_both_engines_judge_by_a_plain_count_over_the_base_table(
    tmp_path_factory: pytest.TempPathFactory,
    edge_rows: list[tuple[str, str, tuple[str, str], Any]],
    profile_rows: list[tuple[bool, Any]],
    line_rows: list[tuple[int, str, Any]],
    total_rows: list[tuple[bool, Any]],
    member_rows: list[tuple[str, str | None, Any]],
    team_rows: list[tuple[bool, int | None]],
) -> None:
    follower_items, wrong_profiles, outside = edge_items(edge_rows, profile_rows)
    cart, wrong_products, inexact, malformed = cart_items(line_rows, total_rows)
    members, wrong_teams, members_outside = member_items(member_rows, team_rows)
    outside |= members_outside
    every = follower_items + cart + members
    found = run(tmp_path_factory.mktemp("export"), every)

    flagged = {pk for (rule, pk, sk), c in found.items() if rule == "followers" and sk == "PROFILE"}
    assert flagged == wrong_profiles
    out = {f"{pk}/{sk}" for (rule, pk, sk), c in found.items() if "unindexed" in c.problems}
    assert out == outside
    products = {pk for (rule, pk, _) in found if rule == "product-totals"}
    # Nothing wrong is missed; nothing right is flagged unless an amount could not be summed.
    assert wrong_products <= products
    assert products - wrong_products <= inexact | malformed
    assert {pk for (rule, pk, sk) in found if rule == "team-members" and sk == "META"} == (
        wrong_teams
    )

    nominated, scanned_outside = gathered(every)
    assert {pk for rule, pk in nominated if rule == "team-members"} == wrong_teams
    assert {pk for rule, pk in nominated if rule == "followers"} == wrong_profiles
    assert {pk for rule, pk in nominated if rule == "product-totals"} == wrong_products | (
        malformed & {f"PRODUCT#{p}" for p in "ab"}
    )
    assert {key for _, key in scanned_outside} == outside


# --- the statements and the finding -----------------------------------------------------------


def test_the_statements_read_the_index_keys_and_fit_their_ddl() -> None:
    statements = plan(DESCRIPTION, RULES, "tally_audit")
    check(statements.create, statements.query, statements.drop)
    to_duckdb(statements.query)
    assert "gsi1pk:struct<s:string>" in statements.create
    assert "gsi2sk:struct<b:string,n:string,s:string>" in statements.create
    assert "item.gsi1sk.s" in statements.query


def test_an_unindexed_row_from_athenas_csv_is_a_candidate_by_the_childs_key() -> None:
    row = {"rule": "followers", "key_0": "USER#ann", "key_1": "FOLLOWS#USER#bob", "unindexed": "1"}
    row |= {"stored": "", "actual": "", "first_missing": ""}
    candidate = parse_candidate(row, RULES)
    assert (candidate.key, candidate.problems) == (
        {"PK": "USER#ann", "SK": "FOLLOWS#USER#bob"},
        {"unindexed": 1},
    )


@pytest.mark.parametrize(
    ("image", "attribute", "held"),
    [
        ({}, "GSI1PK", None),
        ({"GSI1PK": Decimal(7), "GSI1SK": "FOLLOWING#1"}, "GSI1PK", "N"),
        ({"GSI1PK": "", "GSI1SK": "FOLLOWING#1"}, "GSI1PK", "S"),
        ({"GSI1PK": "USER#b"}, "GSI1SK", None),
        ({"GSI1PK": "USER#b", "GSI1SK": Binary(b"x")}, "GSI1SK", "B"),
        ({"GSI1PK": "USER#b", "GSI1SK": True}, "GSI1SK", "BOOL"),
    ],
)
def test_what_keeps_an_item_out_of_the_index_is_named(
    image: dict[str, Any], attribute: str, held: str | None
) -> None:
    rule = RULES["followers"]
    assert isinstance(rule, CountRule)
    why = unindexed(rule, image, KEYS)
    assert why is not None and (why.attribute, why.held) == (attribute, held)
    alert = finding(rule, "T", {"PK": "USER#a", "SK": "FOLLOWS#USER#b"}, why)
    assert (alert.kind, alert.severity, alert.attribute, alert.stored) == (
        "unindexed",
        "warning",
        attribute,
        held,
    )
    assert alert.repair is not None and alert.repair.status == "skipped"
    assert "index 'GSI1' cannot hold it" in alert.detail


def test_an_item_the_index_holds_is_not_unindexed_whatever_its_status() -> None:
    rule = RULES["followers"]
    team = RULES["team-members"]
    assert isinstance(rule, CountRule) and isinstance(team, CountRule)
    assert unindexed(rule, {"GSI1PK": "USER#b", "GSI1SK": "BLOCKED#1"}, KEYS) is None
    assert unindexed(team, {"GSI2PK": "TEAM#t", "GSI2SK": Decimal(3)}, KEYS) is None
    cart = RULES["product-totals"]
    assert isinstance(cart, SumRule)
    assert index_key_types(cart, KEYS) == {"SK": {"S"}, "PK": {"S", "N", "B"}}


def test_an_unindexed_row_of_a_rule_without_an_index_is_refused_naming_the_field() -> None:
    row = {"rule": "likes", "key_0": "POST#1", "key_1": "LIKE#1", "unindexed": "1"}
    with pytest.raises(ValueError, match="unindexed: rule 'likes' finds no children through"):
        parse_candidate(row, RULES)
