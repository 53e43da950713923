"""The audit query held to what Athena runs, and the same text for DuckDB (sqlglot).

``check`` parses the DDL and the DROP as Hive's DDL (Athena's, for tables), the query as
Athena's SQL, refuses a function sqlglot does not know and qualifies every column and struct
field against the table the DDL declares. ``to_duckdb`` transpiles the query for the local
engine. sqlglot is a local-mode dependency: no Lambda imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, OptimizeError, ParseError
from sqlglot.optimizer.qualify import qualify
from sqlglot.schema import MappingSchema


def check(create: str, query: str, drop: str) -> None:
    """Hold the statements to what Athena runs, or raise ``ValueError`` naming the fault.

    The DDL and the DROP parse as Hive's DDL (Athena's, for tables) and name the same table;
    the query parses as Athena's SQL, calls only functions sqlglot knows, and every column
    and struct field it reads resolves against the table the DDL declares.
    """
    try:
        created = sqlglot.parse_one(create, read="hive", error_level=ErrorLevel.RAISE)
        dropped = sqlglot.parse_one(drop, read="hive", error_level=ErrorLevel.RAISE)
        tree = sqlglot.parse_one(query, read="athena", error_level=ErrorLevel.RAISE)
    except ParseError as error:
        raise ValueError(f"the audit statements do not parse: {error}") from None
    if not (isinstance(created, exp.Create) and isinstance(created.this, exp.Schema)):
        raise ValueError("the audit DDL does not declare a table with columns")
    table = created.this.this
    gone = dropped.args.get("tables") or [dropped.this] if isinstance(dropped, exp.Drop) else []
    if not (
        isinstance(table, exp.Table)
        and [(t.db, t.name) for t in gone if isinstance(t, exp.Table)] == [(table.db, table.name)]
    ):
        raise ValueError("the audit DROP does not drop the table the DDL creates")
    unknown = sorted({f.name for f in tree.find_all(exp.Anonymous)})
    if unknown:
        raise ValueError(f"the audit query calls functions Athena lacks: {', '.join(unknown)}")
    columns: dict[str, exp.DataType] = {}
    for column in created.this.expressions:
        kind = column.args.get("kind")
        assert isinstance(column, exp.ColumnDef) and isinstance(kind, exp.DataType)
        columns[column.name.lower()] = kind
    schema = MappingSchema(
        {table.db: {table.name: {n: k.sql("hive") for n, k in columns.items()}}}, dialect="hive"
    )
    try:
        qualified = qualify(tree, schema=schema, dialect="athena", validate_qualify_columns=True)
    except OptimizeError as error:
        raise ValueError(f"the audit query does not fit its table: {error}") from None
    for dot in qualified.find_all(exp.Dot):
        if isinstance(dot.parent, exp.Dot):
            continue
        _check_fields(dot, columns)


def _check_fields(dot: Any, columns: Mapping[str, Any]) -> None:
    """A struct field path (``t.item.pk.s``) names fields the column's type declares."""
    base = dot
    while isinstance(base, exp.Dot):
        base = base.this
    if not isinstance(base, exp.Column) or base.name.lower() not in columns:
        return
    kind = columns[base.name.lower()]
    path = [base.name]
    for part in dot.parts[len(base.parts) :]:
        fields = {
            f.name.lower(): f.args.get("kind")
            for f in (kind.expressions if kind.is_type(exp.DataType.Type.STRUCT) else [])
        }
        path.append(part.name)
        if part.name.lower() not in fields:
            raise ValueError(
                f"the audit query reads {'.'.join(path)}, which its table does not declare"
            )
        kind = fields[part.name.lower()]


def to_duckdb(query: str) -> str:
    """The Athena query as DuckDB runs it (sqlglot's transpiler; no construct left out)."""
    return sqlglot.transpile(
        query, read="athena", write="duckdb", unsupported_level=ErrorLevel.RAISE
    )[0]
