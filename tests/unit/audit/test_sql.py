"""The audit query: Athena's text, checked against its own DDL, run by DuckDB transpiled.

The property tests hold the query to the rules' meaning computed with exact Decimal
arithmetic: every parent or counter that is wrong is a candidate, and a candidate that is
not wrong carries a number the query could not read exactly.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.audit.athena_plan import ExportDescription, plan
from tally.audit.candidates import Candidate, parse_candidate
from tally.audit.sql import EXACT_AMOUNT, AuditQuery
from tally.local.athena_sql import check, to_duckdb
from tally.local.audit_duckdb import candidates
from tally.local.exports import read_export
from tally.rules import DEFAULT_RULES_FILE, RuleSet, load_rules, parse_rules
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


def run(
    tmp_path: Path, items: list[dict[str, Any]], rules: RuleSet = RULES
) -> dict[tuple[str, str], Candidate]:
    directory = write_aws_export(tmp_path, items)
    query = AuditQuery(list(rules), rules.table)
    found = {}
    for candidate in candidates(query, read_export(directory), rules):
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
    rows: list[tuple[bool, Any, list[int]]], holds: str = "last"
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """Items for projects; per wrong counter, the duplicates and missing numbers expected.
    ``holds = "next"``: the counter holds the next free number, member n is the (n+1)-th."""
    shift = 1 if holds == "next" else 0
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
            ordinals = {number + shift for number in numbers}
            if numbers and max(ordinals) > upto:
                problems["counter_behind"] = 1
            missing = len(set(range(1, upto + 1)) - ordinals)
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


NEXT_FREE = parse_rules(
    {
        "table": {"partition_key": "PK", "sort_key": "SK"},
        "rules": [
            {
                "name": "issue-numbers",
                "kind": "sequence",
                "parent": {"PK": "PROJECT#*", "SK": "COUNTER#ISSUE"},
                "counter": "lastIssue",
                "counter_holds": "next",
                "members": {"layout": "collection", "SK": "ISSUE#*", "width": 10},
            }
        ],
    }
)
next_free_projects = st.lists(
    st.tuples(
        st.booleans(),
        st.one_of(st.none(), st.integers(0, 12), st.just("text")),
        st.lists(st.integers(0, 11), max_size=8),
    ),
    max_size=5,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(projects=next_free_projects)
def test_next_free_candidates_are_exactly_the_sequences_that_are_wrong(
    tmp_path_factory: pytest.TempPathFactory, projects: list[tuple[bool, Any, list[int]]]
) -> None:
    """Members numbered from 0 under a counter that holds the next free number: judged as
    ordinals, so counter 4 over members 0-3 is whole and counter 3 over them is behind."""
    items, wrong = sequence_items(projects, "next")
    found = run(tmp_path_factory.mktemp("export"), items, NEXT_FREE)
    assert {pk: c.problems for (_, pk), c in found.items()} == wrong


def test_a_next_free_candidate_shows_its_members_own_numbers(tmp_path: Path) -> None:
    items = [
        item("PROJECT#ok", "COUNTER#ISSUE", lastIssue=n(4)),
        *(item("PROJECT#ok", f"ISSUE#{k:010d}") for k in (0, 1, 2, 3)),
        item("PROJECT#behind", "COUNTER#ISSUE", lastIssue=n(3)),
        *(item("PROJECT#behind", f"ISSUE#{k:010d}") for k in (0, 1, 2, 3)),
        item("PROJECT#gap", "COUNTER#ISSUE", lastIssue=n(4)),
        *(item("PROJECT#gap", f"ISSUE#{k:010d}") for k in (1, 2, 3)),
    ]
    found = {pk: c for (_, pk), c in run(tmp_path, items, NEXT_FREE).items()}
    assert set(found) == {"PROJECT#behind", "PROJECT#gap"}
    behind, gap = found["PROJECT#behind"], found["PROJECT#gap"]
    assert (behind.problems, behind.actual) == ({"counter_behind": 1}, "3")
    assert (gap.problems, gap.actual, gap.first_missing) == ({"missing": 1}, "3", 0)


# --- one text: Athena's, checked against its DDL, transpiled for DuckDB ----------------------

ROOT = Path(__file__).resolve().parents[3]
RULE_FILES = [DEFAULT_RULES_FILE, *sorted((ROOT / "examples" / "adopting").glob("*/rules.toml"))]
DESCRIPTION = ExportDescription(
    ExportArn="arn:aws:dynamodb:us-east-1:123456789012:table/Tally/export/01234-abcd",
    ExportStatus="COMPLETED",
    S3Bucket="bucket",
    S3Prefix="audits",
)


def athena_statements(rules: RuleSet) -> tuple[str, str, str]:
    statements = plan(DESCRIPTION, rules, "tally_audit")
    return statements.create, statements.query, statements.drop


def _exportable(rule: Any, rules: RuleSet) -> bool:
    try:
        AuditQuery([rule], rules.table)
    except ValueError:
        return False
    return True


def _exported(path: Path) -> RuleSet | None:
    """The rules of ``path`` the export engine reads (None: it reads none of them)."""
    rules = load_rules(path)
    exportable = [r for r in rules if r.repair != "off" and _exportable(r, rules)]
    return RuleSet(rules.table, exportable) if exportable else None


# Rules files the export engine reads some rules of; the others are the scan engine's alone.
EXPORTED = [path for path in RULE_FILES if _exported(Path(path)) is not None]


def test_the_export_engine_reads_the_bundled_rules() -> None:
    assert any(Path(path).parent.name == "src" for path in EXPORTED)


@pytest.mark.parametrize("path", EXPORTED, ids=lambda p: Path(p).parent.name)
def test_the_plan_fits_the_table_its_ddl_declares(path: Path) -> None:
    rules = _exported(Path(path))
    assert rules is not None
    check(*athena_statements(rules))
    to_duckdb(athena_statements(rules)[1])  # nothing Athena says that DuckDB cannot


def test_the_athena_ddl_declares_what_the_rules_read() -> None:
    create, query, drop = athena_statements(RULES)
    assert create.startswith(
        "CREATE EXTERNAL TABLE IF NOT EXISTS `tally_audit`.`export_01234_abcd` (item struct<"
    )
    assert "ROW FORMAT SERDE 'org.openx.data.jsonserde.JsonSerDe'" in create
    assert create.endswith("LOCATION 's3://bucket/audits/AWSDynamoDB/01234-abcd/data/'")
    # Only the attributes the rules read, lower-cased as the SerDe matches them.
    assert "pk:struct<s:string>" in create and "lastid:struct<n:string>" in create
    assert "seqname:struct<s:string>" in create and "numidentifier:struct<n:string>" in create
    assert "title" not in create
    assert 'FROM "tally_audit"."export_01234_abcd"' in query
    assert drop == "DROP TABLE IF EXISTS `tally_audit`.`export_01234_abcd`"


@pytest.mark.parametrize(
    ("statement", "old", "new", "fault"),
    [
        (1, "AND val_set THEN", "AND val_sett THEN", "Column 'val_sett' could not be resolved"),
        (1, "regexp_like(", "regexp_lik(", "functions Athena lacks: regexp_lik"),
        (1, "item.pk.s ", "item.pkk.s ", "reads item.pkk, which its table does not declare"),
        (1, ".numidentifier.n ", ".numidentifier.s ", "reads item.numidentifier.s,"),
        (0, "lastid:struct<n:string>", "lastidd:struct<n:string>", "reads item.lastid,"),
        (0, "item struct<", "item struct<<", "do not parse"),
        (2, "export_01234_abcd", "export_other", "does not drop the table the DDL creates"),
    ],
)
def test_a_fault_in_the_statements_is_refused(
    statement: int, old: str, new: str, fault: str
) -> None:
    statements = list(athena_statements(RULES))
    assert old in statements[statement]
    statements[statement] = statements[statement].replace(old, new, 1)
    with pytest.raises(ValueError, match=re.escape(fault)):
        check(*statements)


def test_duckdb_runs_the_athena_text_with_trinos_null_semantics() -> None:
    _, query, _ = athena_statements(RULES)
    transpiled = to_duckdb(query)
    assert "regexp_like" not in transpiled.lower()
    assert "REGEXP_MATCHES" in transpiled
    # Trino's greatest() is NULL when any argument is; DuckDB's skips NULLs unless told.
    row = duckdb.sql(to_duckdb("SELECT greatest(NULL, 1), least(2, NULL), greatest(3, 1)"))
    assert row.fetchall() == [(None, None, 3)]


@pytest.mark.parametrize(
    ("attribute", "problem"),
    [("like-tally", "letters, digits and underscores"), ("pk", "differ only in case")],
)
def test_attributes_the_serde_cannot_read_are_refused(attribute: str, problem: str) -> None:
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
    with pytest.raises(ValueError, match=problem) as error:
        AuditQuery(list(rules), rules.table)
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
