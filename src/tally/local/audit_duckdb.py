"""The export engine on a laptop: the audit query run by DuckDB over an export's files.

DuckDB reads the gzipped DynamoDB JSON lines itself, keeps to a memory limit and spills
to a temporary directory beyond it, so the audit never holds the table in this process.
The query is the one Athena runs, checked against the table its DDL declares and
transpiled to DuckDB by sqlglot; a view over the files stands in for that table. The
candidates it returns take the same path as the scan engine's.

Its stages are told to a ``Stage`` (the command line draws each as a progress bar): the
query, as DuckDB's own estimate in percent while it reads the export's files, then the
candidates as each is checked against the live table.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from tally.audit.candidates import Candidate, parse_candidate
from tally.audit.full_audit import Audit, audited_rules
from tally.audit.report import AuditReport
from tally.audit.scan import Progress
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
# How often the query's progress is read while DuckDB runs it.
_POLL_SECONDS = 0.1

# One stage of a run: what it does and how much there is to do (None: not known
# beforehand); the stage is told each step done.
Stage = Callable[[str, int | None], AbstractContextManager[Progress]]
QUERY_STAGE = "audit: DuckDB queries the export, %"
CHECK_STAGE = "audit: candidates checked"


@contextmanager
def unseen(what: str, total: int | None) -> Iterator[Progress]:
    """A stage nobody watches."""
    yield lambda _: None


class DuckDBMissing(RuntimeError):
    """DuckDB is an optional dependency of the command line, never of the Lambda functions."""


def duckdb_audit(
    reconciler: Reconciler,
    export: Export,
    *,
    rule: str | None = None,
    defer_sequences: bool = False,
    memory_limit: str = MEMORY_LIMIT,
    stage: Stage = unseen,
    sleep: Callable[[float], None] = time.sleep,
) -> AuditReport:
    """Audit ``export`` with DuckDB; candidates go through the reconciler as the scan's do.

    ``stage`` is told the query's progress, then each candidate checked; ``sleep`` waits
    out the sequences' grace period, as the scan engine's does.
    """
    rules = audited_rules(reconciler, rule)
    audit = Audit(reconciler, rules, "duckdb", sleep)
    audit.report.export = {
        "id": export.export_id,
        "table_arn": export.table_arn,
        "export_time": export.export_time,
        "items": export.item_count,
    }
    query = AuditQuery(rules, reconciler.rules.table)
    files = export_files(export)
    if files:
        with _connected(memory_limit) as connection:
            with stage(QUERY_STAGE, 100) as queried:
                cursor = _queried(connection, query, files, queried)
            with stage(CHECK_STAGE, None) as checked:
                found = (parse_candidate(row, reconciler.rules) for row in _rows(cursor))
                audit.check_candidates(found, defer_sequences, checked)
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
    with _connected(memory_limit) as connection:
        yield from _rows(_queried(connection, query, files, None))


@contextmanager
def _connected(memory_limit: str) -> Iterator[Any]:
    """A DuckDB connection that spills beyond ``memory_limit`` to a temporary directory."""
    duckdb = _duckdb()
    with tempfile.TemporaryDirectory(prefix="tally-duckdb-") as spill:
        config = {
            "memory_limit": memory_limit,
            "temp_directory": spill,
            "preserve_insertion_order": False,
        }
        with duckdb.connect(config=config) as connection:
            yield connection


def _queried(
    connection: Any, query: AuditQuery, files: list[str], progress: Progress | None
) -> Any:
    """The cursor of the audit query over ``files``, once DuckDB has run it; ``progress``
    is told DuckDB's estimate, in percent, while it runs."""
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
    connection.execute(f"CREATE SCHEMA {_DATABASE}")
    connection.execute(f"CREATE VIEW {_DATABASE}.{_TABLE} AS SELECT Item AS item FROM {source}")
    sql = to_duckdb(athena)
    if progress is None:
        return connection.execute(sql)
    # DuckDB estimates a running query's progress only with its bar on; it never draws it.
    connection.execute("SET enable_progress_bar = true")
    connection.execute("SET enable_progress_bar_print = false")
    told = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal told
        # DuckDB lets go of the GIL while it runs, and answers query_progress meanwhile.
        while not done.wait(_POLL_SECONDS):
            now = min(100, int(connection.query_progress()))  # -1 before it starts
            if now > told:
                progress(now - told)
                told = now

    watcher = threading.Thread(target=watch, name="duckdb-progress", daemon=True)
    watcher.start()
    try:
        cursor = connection.execute(sql)
    finally:
        done.set()
        watcher.join()
    progress(100 - told)
    return cursor


def _rows(cursor: Any) -> Iterator[dict[str, Any]]:
    """A cursor's rows as they come (never all at once)."""
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
