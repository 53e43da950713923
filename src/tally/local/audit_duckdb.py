"""The export engine on a laptop: the audit query run by DuckDB over an export's files.

DuckDB reads the gzipped DynamoDB JSON lines itself, keeps to a memory limit and spills
to a temporary directory beyond it, so the audit never holds the table in this process.
The query is the one Athena runs, checked against the table its DDL declares and
transpiled to DuckDB by sqlglot; a view over the files stands in for that table. The
candidates it returns take the same path as the scan engine's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

from tally.audit.candidates import Candidate, parse_candidate
from tally.audit.full_audit import Audit, audited_rules
from tally.audit.report import AuditReport
from tally.audit.sql import AuditQuery
from tally.local.athena_sql import check, to_duckdb
from tally.local.exports import Export, export_files
from tally.reconciler.verification import Reconciler
from tally.rules import RuleSet

MEMORY_LIMIT = "1GB"
_BATCH = 1000
# The stand-in for Athena's database and table over the export.
_DATABASE = "tally_audit"
_TABLE = "export"


class DuckDBMissing(RuntimeError):
    """DuckDB is an optional dependency of the command line, never of the Lambda functions."""


def duckdb_audit(
    reconciler: Reconciler,
    export: Export,
    *,
    rule: str | None = None,
    defer_sequences: bool = False,
    memory_limit: str = MEMORY_LIMIT,
) -> AuditReport:
    """Audit ``export`` with DuckDB; candidates go through the reconciler as the scan's do."""
    rules = audited_rules(reconciler, rule)
    audit = Audit(reconciler, rules, "duckdb")
    audit.report.export = {
        "id": export.export_id,
        "table_arn": export.table_arn,
        "export_time": export.export_time,
        "items": export.item_count,
    }
    query = AuditQuery(rules, reconciler.rules.table)
    audit.check_candidates(
        candidates(query, export, reconciler.rules, memory_limit), defer_sequences
    )
    return audit.finish()


def candidates(
    query: AuditQuery, export: Export, rules: RuleSet, memory_limit: str = MEMORY_LIMIT
) -> Iterator[Candidate]:
    """The audit query's rows over ``export``, as they come (never all at once)."""
    for row in query_rows(query, export_files(export), memory_limit):
        yield parse_candidate(row, rules)


def query_rows(
    query: AuditQuery, files: list[str], memory_limit: str = MEMORY_LIMIT
) -> Iterator[dict[str, Any]]:
    """The rows of the query Athena would run, checked, transpiled and run by DuckDB over
    the export's data ``files`` (gzipped DynamoDB JSON lines)."""
    if not files:
        return
    duckdb = _duckdb()
    athena = query.sql(f'"{_DATABASE}"."{_TABLE}"')
    location = os.path.dirname(files[0]) + "/"
    check(
        query.athena_table(_DATABASE, _TABLE, location),
        athena,
        query.athena_drop(_DATABASE, _TABLE),
    )
    source = (
        f"read_json([{', '.join(_literal(f) for f in files)}], format='newline_delimited', "
        f"compression='gzip', columns={{'Item': {_literal(query.duckdb_item_type())}}})"
    )
    with tempfile.TemporaryDirectory(prefix="tally-duckdb-") as spill:
        config = {
            "memory_limit": memory_limit,
            "temp_directory": spill,
            "preserve_insertion_order": False,
        }
        with duckdb.connect(config=config) as connection:
            connection.execute(f"CREATE SCHEMA {_DATABASE}")
            connection.execute(
                f"CREATE VIEW {_DATABASE}.{_TABLE} AS SELECT Item AS item FROM {source}"
            )
            cursor = connection.execute(to_duckdb(athena))
            columns = [d[0] for d in cursor.description]
            while rows := cursor.fetchmany(_BATCH):
                for row in rows:
                    yield dict(zip(columns, row, strict=True))


def _duckdb() -> Any:
    try:
        import duckdb
        import sqlglot  # noqa: F401 - the query is Athena's, transpiled
    except ImportError:
        raise DuckDBMissing(
            "the duckdb engine needs DuckDB and sqlglot: pip install 'tally-reconciler[local]'"
        ) from None
    return duckdb


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
