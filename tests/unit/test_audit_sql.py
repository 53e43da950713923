"""The audit query, run by DuckDB for real over export files; the Athena text checked too.

The property tests hold the query to the rules' meaning computed with exact Decimal
arithmetic: every parent or counter that is wrong is a candidate, and a candidate that is
not wrong carries a number the query could not read exactly.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.local.audit_duckdb import candidates
from tally.local.exports import read_export
from tally.reconciler.audit_sql import ATHENA, DUCKDB, EXACT_AMOUNT, AuditQuery
from tally.reconciler.candidates import Candidate, parse_candidate
from tally.rules import DEFAULT_RULES_FILE, load_rules, parse_rules
from tests.utils import write_aws_export

RULES = load_rules(DEFAULT_RULES_FILE)  # likes, order-total, issue-numbers, user-numbers
COUNTER = ("PROJECT#A", "COUNTER#ISSUE")


def s(value: str) -> dict[str, str]:
    return {"S": value}


def n(value: Any) -> dict[str, str]:
    # DynamoDB keeps numbers normalized: no exponent, no trailing zeros.
    return {"N": value if isinstance(value, str) else f"{Decimal(value).normalize():f}"}


def item(pk: str, sk: str, **attributes: Any) -> dict[str, Any]:
    return {"PK": s(pk), "SK": s(sk), **attributes}


def run(tmp_path: Path, items: list[dict[str, Any]]) -> dict[tuple[str, str], Candidate]:
    directory = write_aws_export(tmp_path, items)
    query = AuditQuery(list(RULES), RULES.table, DUCKDB)
    found = {}
    for candidate in candidates(query, read_export(directory), RULES):
        found[candidate.rule, candidate.key["PK"]] = candidate
    return found


def test_each_kind_of_problem_is_found_and_nothing_else(tmp_path: Path) -> None:
    items = [
        # Posts: one right, one drifted, one with a string counter, likes without a post.
        item("POST#ok", "META", likeTally=n(2)),
        item("POST#ok", "LIKE#1"),
        item("POST#ok", "LIKE#2"),
        item("POST#drift", "META", likeTally=n(5)),
        item("POST#drift", "LIKE#1"),
        item("POST#text", "META", likeTally=s("1")),
        item("POST#text", "LIKE#1"),
        item("POST#gone", "LIKE#1"),
        item("POST#gone", "LIKE#2"),
        # An unrelated item in a post's collection, and one elsewhere.
        item("POST#ok", "COMMENT#1"),
        item("NOTE#1", "META", likeTally=n(99)),
        # Orders: 0.1 + 0.2 is exactly 0.3; 12.34 is not 1; an amount too fine to sum.
        item("ORDER#exact", "META", total=n("0.3")),
        item("ORDER#exact", "LINE#1", amount=n("0.1")),
        item("ORDER#exact", "LINE#2", amount=n("0.2")),
        item("ORDER#drift", "META", total=n("1")),
        item("ORDER#drift", "LINE#1", amount=n("12.34")),
        item("ORDER#fine", "META", total=n("0.0000000001")),
        item("ORDER#fine", "LINE#1", amount=n("0.0000000001")),
        # A sequence with a duplicate (4 twice, padded differently) and holes 3, 6-7, 9.
        item(*COUNTER, lastIssue=n(9)),
        *(item("PROJECT#A", f"ISSUE#{k:010d}") for k in (1, 2, 4, 5, 8)),
        item("PROJECT#A", "ISSUE#000000004"),
        # A counter behind its members; a sequence that is whole.
        item("PROJECT#B", "COUNTER#ISSUE", lastIssue=n(1)),
        item("PROJECT#B", "ISSUE#0000000003"),
        item("PROJECT#C", "COUNTER#ISSUE", lastIssue=n(2)),
        item("PROJECT#C", "ISSUE#0000000001"),
        item("PROJECT#C", "ISSUE#0000000002"),
        # Index layout: numbers held by User# items through seqName; 2 missing, 3 twice.
        item("UserMetadata", "META", LastID=n(3)),
        *(
            item(f"User#{name}", "A", seqName=s("user-numbers"), NumIdentifier=n(k))
            for name, k in (("ann", 1), ("bob", 3), ("cy", 3))
        ),
    ]
    found = run(tmp_path, items)
    problems = {where: c.problems for where, c in found.items()}
    assert problems == {
        ("likes", "POST#drift"): {"drift": 1},
        ("likes", "POST#text"): {"invalid_counter": 1},
        ("likes", "POST#gone"): {"orphans": 1},
        ("order-total", "ORDER#drift"): {"drift": 1},
        ("order-total", "ORDER#fine"): {"inexact": 1},
        ("issue-numbers", "PROJECT#A"): {"duplicates": 1, "missing": 4},
        ("issue-numbers", "PROJECT#B"): {"counter_behind": 1, "missing": 1},
        ("user-numbers", "UserMetadata"): {"duplicates": 1, "missing": 1},
    }
    drift = found["order-total", "ORDER#drift"]
    assert (drift.key, drift.stored, drift.actual) == (
        {"PK": "ORDER#drift", "SK": "META"},
        "1",
        "12.34",
    )
    orphans = found["likes", "POST#gone"]
    assert (orphans.key["SK"], orphans.stored, orphans.actual) == ("META", None, "2")
    assert found["issue-numbers", "PROJECT#A"].first_missing == 3
    assert found["issue-numbers", "PROJECT#A"].counter_seen == 9
    behind = found["issue-numbers", "PROJECT#B"]
    assert (behind.actual, behind.first_missing) == ("3", 1)
    assert found["user-numbers", "UserMetadata"].key == {"PK": "UserMetadata", "SK": "META"}


def test_an_empty_export_has_no_candidates(tmp_path: Path) -> None:
    assert run(tmp_path, []) == {}


# --- the query against the rules' meaning, for any table ---------------------------------

digits = st.integers(min_value=0, max_value=10**12)
amounts = st.builds(
    lambda units, places: Decimal(units).scaleb(-places), digits, st.integers(0, 12)
)
counters = st.one_of(st.none(), st.integers(0, 8).map(Decimal), amounts, st.just("text"))
posts = st.lists(st.tuples(st.booleans(), counters, st.integers(0, 4)), max_size=6)
orders = st.lists(st.tuples(st.booleans(), counters, st.lists(amounts, max_size=3)), max_size=6)
held = st.lists(st.integers(1, 12), max_size=8)
projects = st.lists(
    st.tuples(st.booleans(), st.one_of(st.none(), st.integers(0, 12), st.just("text")), held),
    max_size=5,
)


def counter_value(value: Any) -> dict[str, str]:
    return s(value) if isinstance(value, str) else n(value)


def tally_items(
    kind: str, rows: list[tuple[bool, Any, Any]]
) -> tuple[list[dict[str, Any]], set[str], set[str]]:
    """Items for posts or orders; the parents that are wrong, and those with inexact numbers."""
    items: list[dict[str, Any]] = []
    wrong, inexact = set(), set()
    attribute, child, summed = (
        ("likeTally", "LIKE#", None) if kind == "POST" else ("total", "LINE#", "amount")
    )
    for index, (exists, counter, children) in enumerate(rows):
        pk = f"{kind}#{index}"
        amounts_ = [Decimal(1)] * children if summed is None else list(children)
        for number, amount in enumerate(amounts_):
            extra = {} if summed is None else {summed: n(amount)}
            items.append(item(pk, f"{child}{number}", **extra))
            if summed and not _exact(amount):
                inexact.add(pk)
        if exists:
            items.append(
                item(pk, "META", **({} if counter is None else {attribute: counter_value(counter)}))
            )
            if isinstance(counter, Decimal) and not _exact(counter):
                inexact.add(pk)
        truth = sum(amounts_, Decimal(0))
        stored = Decimal(0) if counter is None else counter
        if (not exists and amounts_) or (exists and (isinstance(stored, str) or stored != truth)):
            wrong.add(pk)
    return items, wrong, inexact


def _exact(value: Decimal) -> bool:
    import re

    return re.match(EXACT_AMOUNT, n(value)["N"]) is not None


def sequence_items(
    rows: list[tuple[bool, Any, list[int]]],
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """Items for projects; per wrong counter, the duplicates and missing numbers expected."""
    items: list[dict[str, Any]] = []
    expected: dict[str, dict[str, int]] = {}
    for index, (exists, counter, numbers) in enumerate(rows):
        pk = f"PROJECT#{index}"
        for copy, number in enumerate(numbers):
            # The same number twice needs two keys: pad it to another width.
            width = 10 if numbers[:copy].count(number) == 0 else 10 + numbers[:copy].count(number)
            items.append(item(pk, "ISSUE#" + str(number).zfill(width)))
        if exists:
            items.append(
                item(
                    pk,
                    "COUNTER#ISSUE",
                    **({} if counter is None else {"lastIssue": counter_value(counter)}),
                )
            )
        problems: dict[str, int] = {}
        if isinstance(counter, str) and exists:
            problems["invalid_counter"] = 1
        else:
            upto = counter if exists and isinstance(counter, int) else 0
            if numbers and max(numbers) > upto:
                problems["counter_behind"] = 1
            missing = len(set(range(1, upto + 1)) - set(numbers))
            if missing:
                problems["missing"] = missing
        duplicates = sum(1 for k in set(numbers) if numbers.count(k) > 1)
        if duplicates:
            problems["duplicates"] = duplicates
        if problems:
            expected[pk] = problems
    return items, expected


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(posts=posts, orders=orders, projects=projects)
def test_candidates_are_exactly_what_is_wrong_or_inexact(
    tmp_path_factory: pytest.TempPathFactory,
    posts: list[tuple[bool, Any, int]],
    orders: list[tuple[bool, Any, list[Decimal]]],
    projects: list[tuple[bool, Any, list[int]]],
) -> None:
    post_items, wrong_posts, _ = tally_items("POST", posts)
    order_items, wrong_orders, inexact_orders = tally_items("ORDER", orders)
    project_items, wrong_projects = sequence_items(projects)
    found = run(tmp_path_factory.mktemp("export"), post_items + order_items + project_items)

    flagged = {pk for (rule, pk) in found if rule == "likes"}
    assert flagged == wrong_posts
    flagged = {pk for (rule, pk) in found if rule == "order-total"}
    # Nothing wrong is missed; nothing right is flagged unless a number was too fine to sum.
    assert wrong_orders <= flagged
    assert flagged - wrong_orders <= inexact_orders
    for pk in flagged - wrong_orders:
        assert found["order-total", pk].problems == {"inexact": 1}
    sequences = {pk: c.problems for (rule, pk), c in found.items() if rule == "issue-numbers"}
    assert sequences == wrong_projects


# --- the Athena variant ---------------------------------------------------------------------


def test_the_athena_text_parses_as_athena_sql() -> None:
    query = AuditQuery(list(RULES), RULES.table, ATHENA)
    sqlglot.parse_one(query.sql('"tally_audit"."export_01"'), read="athena")
    ddl = query.athena_table("tally_audit", "export_01", "s3://bucket/audits/AWSDynamoDB/x/data/")
    assert ddl.startswith(
        "CREATE EXTERNAL TABLE IF NOT EXISTS `tally_audit`.`export_01` (item struct<"
    )
    assert "ROW FORMAT SERDE 'org.openx.data.jsonserde.JsonSerDe'" in ddl
    assert ddl.endswith("LOCATION 's3://bucket/audits/AWSDynamoDB/x/data/'")
    # Only the attributes the rules read, lower-cased as the SerDe matches them.
    assert "pk:struct<s:string>" in ddl and "lastid:struct<n:string>" in ddl
    assert "seqname:struct<s:string>" in ddl and "numidentifier:struct<n:string>" in ddl
    assert "title" not in ddl


def test_the_athena_text_finds_what_the_duckdb_text_finds(tmp_path: Path) -> None:
    """Run on DuckDB with stand-ins for Athena's differences: a regexp_like function, and the
    table the JSON SerDe makes of the export, whose names it matches case-insensitively."""
    items = [
        item("POST#1", "META", likeTally=n(3)),
        item("POST#1", "LIKE#1"),
        item("ORDER#1", "META", total=n("2.5")),
        item("ORDER#1", "LINE#1", amount=n("2.25")),
        item(*COUNTER, lastIssue=n(3)),
        item("PROJECT#A", "ISSUE#0000000003"),
        item("UserMetadata", "META", LastID=n(1)),
    ]
    athena = AuditQuery(list(RULES), RULES.table, ATHENA)
    duck = AuditQuery(list(RULES), RULES.table, DUCKDB)
    connection = duckdb.connect()
    connection.execute("CREATE MACRO regexp_like(s, p) AS regexp_matches(s, p)")
    serde = write_aws_export(tmp_path / "serde", [lowered(i) for i in items])
    hive = athena.item_type().replace(":", " ").replace("struct<", "STRUCT(").replace(">", ")")
    connection.execute(
        f"CREATE TABLE export AS SELECT * FROM read_json({data_files(serde)}, "
        f"format='newline_delimited', columns={{'Item': '{hive}'}})"
    )
    via_athena = connection.execute(athena.sql("export")).fetchall()
    plain = write_aws_export(tmp_path / "plain", items)
    source = (
        f"read_json({data_files(plain)}, format='newline_delimited', "
        f"columns={{'Item': '{duck.item_type()}'}})"
    )
    via_duckdb = connection.execute(duck.sql(source)).fetchall()
    assert via_athena == via_duckdb
    expected = ["issue-numbers", "likes", "order-total", "user-numbers"]
    assert [row[0] for row in via_duckdb] == expected


def lowered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k.lower(): lowered(v) for k, v in value.items()}
    return value


def data_files(directory: Path) -> list[str]:
    return [str(p) for p in sorted((directory / "data").glob("*.json.gz")) if p.stat().st_size]


@pytest.mark.parametrize(
    ("attribute", "problem"),
    [("like-tally", "letters, digits and underscores"), ("pk", "differ only in case")],
)
def test_athena_refuses_attributes_its_serde_cannot_read(attribute: str, problem: str) -> None:
    rules = parse_rules(
        {
            "rules": [
                {
                    "name": "likes",
                    "kind": "count",
                    "parent": {"PK": "POST#*", "SK": "META"},
                    "children": {"SK": "LIKE#*"},
                    "counter": attribute,
                }
            ]
        }
    )
    AuditQuery(list(rules), rules.table, DUCKDB)  # DuckDB quotes any name
    with pytest.raises(ValueError, match=problem) as error:
        AuditQuery(list(rules), rules.table, ATHENA)
    assert repr(attribute) in str(error.value)


# --- rows as they arrive (Athena's CSV: strings, empty for NULL) -------------------------------


def test_a_csv_row_becomes_a_candidate() -> None:
    row = {
        "rule": "issue-numbers",
        "key_0": "PROJECT#A",
        "key_1": "COUNTER#ISSUE",
        "stored": "9",
        "actual": "8",
        "drift": "0",
        "orphans": "0",
        "invalid_counter": "0",
        "inexact": "0",
        "counter_behind": "0",
        "duplicates": "1",
        "missing": "4",
        "first_missing": "3",
    }
    candidate = parse_candidate(row, RULES)
    assert candidate == Candidate(
        "issue-numbers",
        {"PK": "PROJECT#A", "SK": "COUNTER#ISSUE"},
        "9",
        "8",
        {"duplicates": 1, "missing": 4},
        3,
    )
    orphan = parse_candidate(
        {
            "rule": "likes",
            "key_0": "POST#1",
            "key_1": "META",
            "stored": "",
            "actual": "2.000000000",
            "orphans": "1",
            "first_missing": "",
        },
        RULES,
    )
    assert (orphan.stored, orphan.actual, orphan.counter_seen) == (None, "2", 0)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rule": "nope"}, "rule"),
        ({"key_1": ""}, "key_1"),
        ({"missing": "many"}, "missing"),
        ({"actual": "x"}, "actual"),
        ({"surprise": "1"}, "surprise"),
    ],
)
def test_a_malformed_row_is_refused_naming_the_field(change: dict[str, str], field: str) -> None:
    row = {"rule": "likes", "key_0": "POST#1", "key_1": "META", "drift": "1"} | change
    with pytest.raises(ValueError, match=field):
        parse_candidate(row, RULES)
