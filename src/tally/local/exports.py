"""DynamoDB's export-to-S3 layout on disk: written from a table, read back (or from AWS).

An export lives in ``AWSDynamoDB/<exportId>/``: ``manifest-summary.json`` (the export's ARN,
times, item count and output format), ``manifest-files.json`` (one JSON line per data file:
``itemCount``, ``md5Checksum`` (base64 MD5 of the file), ``etag``, ``dataFileS3Key``),
a ``.checksum`` file (hex MD5) next to each manifest, an empty ``_started`` marker, and
``data/<name>.json.gz``: one ``{"Item": {...}}`` line of DynamoDB JSON per item.

``write_export`` writes a table (DynamoDB Local, or any table) in that layout from a
parallel scan; ``read_export`` reads it, or an AWS export downloaded from S3 unchanged, and
checks every file against the manifests before anything is audited.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from tally.core.timefmt import iso, now_iso

ROOT = "AWSDynamoDB"
SUMMARY = "manifest-summary.json"
FILES = "manifest-files.json"
# Rolled over at this many items, so one data file never grows without bound.
ITEMS_PER_FILE = 250_000
# Items per scan page: a 1 MB page of small items is tens of MB once parsed.
PAGE_ITEMS = 1000
Progress = Callable[[int], None]


class ExportError(ValueError):
    """The export is missing, incomplete or not readable by the audit; says which file/field."""


class ForeignExportError(ExportError):
    """The export is of another table than the one it would be audited against."""


@dataclass(frozen=True)
class DataFile:
    """One data file of an export, as its manifest line describes it."""

    path: Path
    item_count: int
    md5: str  # base64, as in manifest-files.json


@dataclass(frozen=True)
class Export:
    """An export on disk, checked against its manifests."""

    directory: Path
    export_id: str
    summary: dict[str, Any]
    files: tuple[DataFile, ...]
    # Exports of other tables found beside it and left out (``export_of``).
    left_out: int = 0

    @property
    def item_count(self) -> int:
        return sum(f.item_count for f in self.files)

    @property
    def export_time(self) -> str:
        return str(self.summary.get("exportTime") or "")

    @property
    def table_arn(self) -> str:
        return str(self.summary.get("tableArn") or "")


# --- writing --------------------------------------------------------------------------------


def export_table(out: Path, *, segments: int = 4, progress: Progress | None = None) -> Export:
    """The table the environment names (``TABLE_NAME``), exported under ``out``."""
    from tally.core.aws import client
    from tally.core.settings import settings

    return write_export(
        client("dynamodb"), settings().table_name, out, segments=segments, progress=progress
    )


def write_export(
    client: Any,
    table_name: str,
    out: Path,
    *,
    segments: int = 4,
    items_per_file: int = ITEMS_PER_FILE,
    progress: Progress | None = None,
) -> Export:
    """Write ``table_name`` as a full export under ``out``; nothing half-written is left behind.

    A parallel scan is not a point-in-time snapshot, unlike DynamoDB's export: the audit
    treats what it finds as candidates either way.
    """
    table = client.describe_table(TableName=table_name)["Table"]
    started = now_iso()
    export_id = f"{int(time.time() * 1000):014d}-{secrets.token_hex(4)}"
    staging = out / ROOT / f".{export_id}.partial"
    (staging / "data").mkdir(parents=True)
    try:
        _write(client, table, export_id, staging, segments, items_per_file, progress, started)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    final = out / ROOT / export_id
    staging.rename(final)
    return read_export(final)


def _write(
    client: Any,
    table: dict[str, Any],
    export_id: str,
    staging: Path,
    segments: int,
    items_per_file: int,
    progress: Progress | None,
    started: str,
) -> None:
    table_name = table["TableName"]
    prefix = f"{ROOT}/{export_id}"
    (staging / "_started").touch()
    with ThreadPoolExecutor(segments) as pool:
        parts = list(
            pool.map(
                lambda segment: _write_segment(
                    client, table_name, segment, segments, staging, items_per_file, progress
                ),
                range(segments),
            )
        )
    lines: list[dict[str, Any]] = []
    billed = 0
    for written, size in parts:
        billed += size
        for name, count, digest in written:
            lines.append(
                {
                    "itemCount": count,
                    "md5Checksum": base64.b64encode(digest).decode(),
                    "etag": digest.hex(),
                    "dataFileS3Key": f"{prefix}/data/{name}",
                }
            )
    files_text = "".join(json.dumps(line) + "\n" for line in lines)
    _write_with_checksum(staging / FILES, files_text)
    summary = {
        "version": "2020-06-30",
        "exportArn": f"{table['TableArn']}/export/{export_id}",
        "startTime": started,
        "endTime": now_iso(),
        "tableArn": table["TableArn"],
        "tableId": table.get("TableId"),
        # Not in AWS's summary: what tells apart two tables of one ARN where there is no id.
        "tableCreationDateTime": _created(table),
        "exportTime": started,
        "s3Bucket": None,
        "s3Prefix": None,
        "s3SseAlgorithm": None,
        "s3SseKmsKeyId": None,
        "manifestFilesS3Key": f"{prefix}/{FILES}",
        "billedSizeBytes": billed,
        "itemCount": sum(line["itemCount"] for line in lines),
        "outputFormat": "DYNAMODB_JSON",
        "exportType": "FULL_EXPORT",
    }
    # The summary goes last: a reader that finds it finds a complete export.
    _write_with_checksum(staging / SUMMARY, json.dumps(summary, indent=2) + "\n")


def _write_segment(
    client: Any,
    table_name: str,
    segment: int,
    segments: int,
    staging: Path,
    items_per_file: int,
    progress: Progress | None,
) -> tuple[list[tuple[str, int, bytes]], int]:
    """One scan segment into its own data files: (name, items, md5) per file, and bytes."""
    files = _DataFiles(staging / "data", items_per_file)
    pages = client.get_paginator("scan").paginate(
        TableName=table_name,
        Segment=segment,
        TotalSegments=segments,
        ConsistentRead=True,
        Limit=PAGE_ITEMS,
    )
    try:
        for page in pages:
            for item in page["Items"]:
                files.write(json.dumps({"Item": _plain(item)}, separators=(",", ":")) + "\n")
            if progress:
                progress(len(page["Items"]))
    finally:
        files.close()
    return files.written, files.size


class _DataFiles:
    """One segment's gzipped data files, a new one every ``limit`` items."""

    def __init__(self, directory: Path, limit: int):
        self.directory = directory
        self.limit = limit
        self.written: list[tuple[str, int, bytes]] = []
        self.size = 0
        self._handle: Any = None
        self._name = ""
        self._count = 0

    def write(self, line: str) -> None:
        if self._handle is None or self._count >= self.limit:
            self.close()
            self._name, self._count = f"{secrets.token_hex(12)}.json.gz", 0
            # Closed by close(): a file spans many calls.
            self._handle = gzip.open(self.directory / self._name, "wt", compresslevel=6)  # noqa: SIM115
        self._handle.write(line)
        self.size += len(line)
        self._count += 1

    def close(self) -> None:
        if self._handle is None:
            return
        self._handle.close()
        self._handle = None
        digest = hashlib.md5((self.directory / self._name).read_bytes()).digest()
        self.written.append((self._name, self._count, digest))


def _plain(value: Any) -> Any:
    """DynamoDB JSON as the export writes it: binary values base64-encoded."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _write_with_checksum(path: Path, text: str) -> None:
    data = text.encode()
    path.write_bytes(data)
    path.with_suffix(".checksum").write_text(hashlib.md5(data).hexdigest())


# --- reading --------------------------------------------------------------------------------


def find_export(path: Path) -> Path:
    """The export directory ``path`` names: itself, or the newest export found under it."""
    return _newest(exports_under(path))


def exports_under(path: Path) -> list[Path]:
    """The export directories ``path`` names: itself, or every export found under it."""
    if path.is_file() and path.name == SUMMARY:
        return [path.parent]
    if (path / SUMMARY).is_file():
        return [path]
    if not path.exists():
        raise ExportError(f"{path}: no such file or directory")
    found = [p.parent for p in path.glob(f"**/{ROOT}/*/{SUMMARY}")]
    if not found:
        raise ExportError(f"{path}: no DynamoDB export under it ({ROOT}/<exportId>/{SUMMARY})")
    return found


def _newest(directories: list[Path]) -> Path:
    return max(directories, key=lambda d: (_summary(d).get("exportTime") or "", d.name))


@dataclass(frozen=True)
class TableIdentity:
    """Which table an export is of: its ARN, and what tells two tables of one ARN apart (one
    dropped and created again; DynamoDB Local's of the same name on another machine)."""

    arn: str
    table_id: str | None = None
    created: str | None = None

    @classmethod
    def described(cls, table: Mapping[str, Any]) -> TableIdentity:
        """From DescribeTable's ``Table``."""
        return cls(str(table["TableArn"]), table.get("TableId"), _created(table))

    @classmethod
    def exported(cls, summary: Mapping[str, Any]) -> TableIdentity:
        """From an export's summary (``tableCreationDateTime`` is written by ``tally export``)."""
        return cls(
            str(summary.get("tableArn") or ""),
            summary.get("tableId"),
            summary.get("tableCreationDateTime"),
        )

    def same(self, other: TableIdentity) -> bool:
        pairs = ((self.table_id, other.table_id), (self.created, other.created))
        return self.arn == other.arn and not any(a and b and a != b for a, b in pairs)

    def named_against(self, other: TableIdentity) -> str:
        """The ARN, and what tells this table from ``other`` when the ARNs are the same."""
        if self.arn != other.arn:
            return self.arn
        if self.table_id and other.table_id and self.table_id != other.table_id:
            return f"{self.arn} (table id {self.table_id})"
        return f"{self.arn} (created {self.created})"


def export_of(path: Path, table: TableIdentity, *, any_table: bool = False) -> Export:
    """The newest export under ``path`` of ``table``, read and checked.

    ForeignExportError naming both tables when ``path`` holds no export of ``table``; with
    ``any_table``, then the newest export of any table.
    """
    found = exports_under(path)
    ours = [d for d in found if table.same(TableIdentity.exported(_summary(d)))]
    if ours:
        return replace(read_export(_newest(ours)), left_out=len(found) - len(ours))
    newest = _newest(found)
    if any_table:
        return replace(read_export(newest), left_out=len(found) - 1)
    summary = _summary(newest)
    theirs = TableIdentity.exported(summary)
    more = f" (and {len(found) - 1} more exports of other tables)" if len(found) > 1 else ""
    raise ForeignExportError(
        f"{path}: export {newest.name} (exported {summary.get('exportTime')}) is of "
        f"table {theirs.named_against(table)}{more}, not of the target's table "
        f"{table.named_against(theirs)}"
    )


def _created(table: Mapping[str, Any]) -> str | None:
    created = table.get("CreationDateTime")
    if not isinstance(created, datetime):
        return None
    return iso(created, "milliseconds")


def read_export(path: Path, *, verify: bool = True) -> Export:
    """The export at ``path`` (see ``find_export``), its files checked against the manifests."""
    directory = find_export(path)
    summary = _summary(directory)
    where = directory / SUMMARY
    if summary.get("outputFormat", "DYNAMODB_JSON") != "DYNAMODB_JSON":
        raise ExportError(
            f"{where}: outputFormat {summary['outputFormat']!r}: the audit reads DYNAMODB_JSON"
        )
    if summary.get("exportType", "FULL_EXPORT") != "FULL_EXPORT":
        raise ExportError(
            f"{where}: exportType {summary['exportType']!r}: an incremental export holds changes, "
            "not the table; the audit needs a full export"
        )
    files = tuple(_data_files(directory))
    expected = summary.get("itemCount")
    counted = sum(f.item_count for f in files)
    if not isinstance(expected, int) or expected != counted:
        raise ExportError(
            f"{where}: itemCount {expected!r} but {FILES} lists {counted} items: incomplete export"
        )
    export = Export(directory, directory.name, summary, files)
    if verify:
        for data in files:
            _verify(data)
    return export


def _summary(directory: Path) -> dict[str, Any]:
    where = directory / SUMMARY
    try:
        summary = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ExportError(f"{where}: {error}") from None
    if not isinstance(summary, dict):
        raise ExportError(f"{where}: not a JSON object")
    return summary


def _data_files(directory: Path) -> Iterator[DataFile]:
    where = directory / FILES
    try:
        text = where.read_text(encoding="utf-8")
    except OSError as error:
        raise ExportError(f"{where}: {error}") from None
    # dataFileS3Key carries the export prefix the export was requested with; on disk the
    # file is found below the export directory, whatever that prefix was.
    marker = f"{ROOT}/{directory.name}/"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            key, count, md5 = entry["dataFileS3Key"], entry["itemCount"], entry["md5Checksum"]
        except (ValueError, KeyError, TypeError) as error:
            raise ExportError(f"{where} line {number}: {type(error).__name__}: {error}") from None
        if not isinstance(key, str) or marker not in key:
            raise ExportError(
                f"{where} line {number}: dataFileS3Key {key!r} is not inside this export"
            )
        if not isinstance(count, int) or count < 0:
            raise ExportError(f"{where} line {number}: itemCount {count!r} is not a count")
        relative = key.split(marker, 1)[1]
        if ".." in Path(relative).parts:
            raise ExportError(f"{where} line {number}: dataFileS3Key {key!r} leaves the export")
        yield DataFile(directory / relative, count, str(md5))


def _verify(data: DataFile) -> None:
    digest = hashlib.md5()
    try:
        with data.path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:
        raise ExportError(f"{data.path}: {error}") from None
    actual = base64.b64encode(digest.digest()).decode()
    if actual != data.md5:
        raise ExportError(
            f"{data.path}: md5 {actual} but {FILES} says {data.md5}: the file is damaged"
        )


def export_files(export: Export) -> list[str]:
    """The data files an engine should read (empty partitions' files left out)."""
    return [os.fspath(f.path) for f in export.files if f.item_count]
