"""The ``tally`` commands that operate on any target (the local stack, a deployed stack, or
the environment's): ``audit``, ``export`` and ``replay``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import tally.cli.console as console
import tally.cli.targets as targets
from tally.cli.console import Failure, UsageError
from tally.cli.options import rules_file
from tally.rules import load_rules


def audit(options: argparse.Namespace) -> int:
    from tally.audit.full_audit import full_audit
    from tally.reconciler import runtime
    from tally.reconciler.repair.policy import RepairPolicy

    if (options.engine == "duckdb") != (options.export is not None):
        raise UsageError("--export goes with --engine duckdb, and --engine duckdb with --export")
    if options.export is not None and options.parent is not None:
        raise UsageError("--parent audits one parent by reading the table: not with --export")
    if options.export_of_another_table and options.export is None:
        raise UsageError("--export-of-another-table goes with --engine duckdb --export")
    if options.export is not None:
        _exports_under(options.export)  # a path that holds no export: before any target
    with targets.environment(options.stack, rules_file(options)):
        rules = load_rules()
        rule = _rule(rules, options.rule, options.parent)
        total = targets.item_count()
        if options.repair:
            _refuse_repairs_on_a_global_table("tally audit --repair")
        export = None
        if options.export is not None:
            export = _read_export(options.export, options.export_of_another_table)
        # The CLI is an operator's deliberate act: a dry run unless --repair, no budget cap;
        # but the repair switches are everyone's (an incident's kill switch stops it too).
        switches = runtime.switches()
        if options.repair:
            policy = RepairPolicy(switches.enabled, switches.dry_run, 10**9, switches=switches)
        else:
            policy = RepairPolicy(dry_run=True, budget=10**9, switches=switches)
        alerting = options.repair or options.alert
        # A dry run's findings are shown to the operator, not recorded or published.
        reconciler = runtime.reconciler(policy, alerting=alerting)
        grace = console.waiting(
            "audit: parentless children and sequences are judged a grace period later"
        )
        if export is not None:
            from tally.local.audit_duckdb import DuckDBMissing, duckdb_audit

            def stage(what: str, total: int | None) -> Any:
                return console.progress(what, total, enabled=not options.json)

            try:
                report = duckdb_audit(reconciler, export, rule=rule, stage=stage, sleep=grace)
            except DuckDBMissing as error:
                raise Failure(str(error)) from None
        else:
            scanning = options.parent is None and not options.json
            with console.progress("audit: items scanned", total, enabled=scanning) as advance:
                report = full_audit(
                    reconciler,
                    rule=rule,
                    parent=options.parent,
                    segments=options.segments,
                    progress=advance,
                    sleep=grace,
                )
        findings = reconciler.log
        if options.parent is not None and not findings:
            _parent_exists(rules, options.parent)
    console.note(f"audit: {switches.describe()}")
    if options.json:
        detail = {"findings_detail": [f.body() for f in findings], "switches": switches.as_json()}
        print(json.dumps(report.as_json() | detail))
    else:
        console.print_audit(report.as_json(), findings, options.repair, alerting, report.state)
    return 1 if findings or report.state else 0


def _parent_exists(rules: Any, parent: dict[str, str]) -> None:
    """Failure when the table holds no item at ``parent`` (and so the audit found nothing)."""
    from tally.core.aws import client
    from tally.core.dynamodb import serialize

    table = targets.table_name()
    key = serialize(rules.table.typed(parent))
    item = client("dynamodb").get_item(TableName=table, Key=key, ConsistentRead=True)
    if "Item" not in item:
        raise Failure(
            f"{console.pattern(parent)}: no such item in table {table}, and no finding under "
            "that key: nothing to audit (check the key; `tally audit` audits every parent)"
        )


def _exports_under(path: Path) -> None:
    from tally.local.exports import ExportError, exports_under

    try:
        exports_under(path)
    except (ExportError, OSError) as error:
        raise UsageError(f"--export {error}") from None


def _read_export(path: Path, any_table: bool) -> Any:
    """The export to audit, named on stderr: the target table's newest under ``path``, or
    (``any_table``) another table's, said so."""
    from tally.local.exports import ExportError, ForeignExportError, TableIdentity, export_of

    target = TableIdentity.described(_target_table())
    try:
        export = export_of(path, target, any_table=any_table)
    except ForeignExportError as error:
        raise UsageError(f"--export {error}; --export-of-another-table audits it anyway") from None
    except (ExportError, OSError) as error:
        raise UsageError(f"--export {error}") from None
    console.note(
        f"audit: export {export.export_id} of table {export.table_arn or '(not named)'}, "
        f"exported {export.export_time or '(time not named)'}, {export.item_count} items, "
        f"in {export.directory}"
    )
    if not target.same(TableIdentity.exported(export.summary)):
        console.note(
            f"audit: that export is of another table than the target's ({target.arn}): "
            "audited as "
            "--export-of-another-table asks, its findings judged against the target's table"
        )
    if export.left_out:
        console.note(f"audit: {export.left_out} exports of other tables under {path} left out")
    return export


def _refuse_repairs_on_a_global_table(what: str) -> None:
    """On a Global Table a repair is a write in one Region that a write still on its way from
    another would race (docs/global-tables.md): only the home Region's reconciler repairs,
    and only once replication settled, never an operator's command."""
    table = _target_table()
    replicas = [str(r.get("RegionName")) for r in table.get("Replicas", [])]
    if replicas:
        raise UsageError(
            f"{what}: table {table.get('TableName')!r} is a Global Table (replicas in "
            f"{', '.join(replicas)}); its repairs are the home Region's reconciler's, once "
            "replication settled (docs/global-tables.md)"
        )


def _target_table() -> dict[str, Any]:
    """The target table's description (DescribeTable's ``Table``)."""
    from tally.core.aws import client
    from tally.core.settings import settings

    dynamodb = client("dynamodb", config=targets.PREFLIGHT)
    table: dict[str, Any] = dynamodb.describe_table(TableName=settings().table_name)["Table"]
    return table


def export(options: argparse.Namespace) -> int:
    from tally.local.exports import export_table

    with targets.environment(options.stack, rules_file(options)):
        total = targets.item_count()
        try:
            with console.progress("export: items written", total) as advance:
                export = export_table(options.out, segments=options.segments, progress=advance)
        except OSError as error:
            raise Failure(f"--out {options.out}: {error.strerror or error}") from None
    if options.json:
        print(
            json.dumps(
                {
                    "directory": str(export.directory),
                    "export_id": export.export_id,
                    "items": export.item_count,
                }
            )
        )
        return 0
    # The whole sentence on stderr, the directory alone on stdout: `$(tally export ...)`.
    console.note(f"export: {export.item_count} items written to {export.directory}")
    print(export.directory)
    return 0


def _rule(rules: Any, name: str | None, parent: dict[str, str] | None) -> str | None:
    """The rule to audit; UsageError for a rule or parent key the rules do not know."""
    described = "; ".join(f"{r.name} ({console.pattern(r.parent)})" for r in rules)
    if name is not None:
        if name not in {r.name for r in rules}:
            raise UsageError(f"no rule named {name!r}; the rules: {described}")
        if rules[name].repair == "off":
            raise UsageError(f'rule {name!r} has repair = "off": the audit skips it')
    if parent is None:
        return name
    expected = list(rules.table.names)
    if missing := [n for n in expected if n not in parent]:
        raise UsageError(
            f"--parent lacks {', '.join(missing)}: it needs exactly {', '.join(expected)}, "
            "pairs separated by ',' (PK=POST#a91f,SK=META)"
        )
    if extra := [n for n in parent if n not in expected]:
        raise UsageError(
            f"--parent: {', '.join(extra)} is not a key attribute ({', '.join(expected)})"
        )
    owners = [m.rule.name for m in rules.classify(parent) if m.role == "parent"]
    if name is not None and name not in owners:
        raise UsageError(
            f"{console.pattern(parent)} is not a parent of rule {name!r} "
            f"({console.pattern(rules[name].parent)})"
        )
    if not owners:
        raise UsageError(
            f"{console.pattern(parent)} is the parent of no rule; the rules: {described}"
        )
    return name if name is not None else (owners[0] if len(owners) == 1 else None)


def replay(options: argparse.Namespace) -> int:
    from tally.reconciler.replay import replay

    with targets.environment(options.stack, rules_file(options)):
        targets.item_count()
        _refuse_repairs_on_a_global_table("tally replay")
        outcome = replay(say=console.note)
    print(json.dumps(outcome))
    return 0 if not outcome["failed"] else 1
