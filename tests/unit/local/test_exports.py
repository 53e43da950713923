"""Reading an export as DynamoDB writes it to S3, downloaded unchanged; refusing a bad one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tally.local.exports import ExportError, export_files, find_export, read_export
from tests.utils import write_aws_export

ITEMS = [{"PK": {"S": f"POST#{i}"}, "SK": {"S": "META"}, "likeTally": {"N": "0"}} for i in range(5)]


def summary_of(directory: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((directory / "manifest-summary.json").read_text())
    return loaded


def rewrite_summary(directory: Path, **changes: Any) -> None:
    (directory / "manifest-summary.json").write_text(json.dumps(summary_of(directory) | changes))


def test_an_aws_export_is_read_from_the_download_root(tmp_path: Path) -> None:
    directory = write_aws_export(tmp_path, ITEMS, prefix="audits/2025/01")

    export = read_export(tmp_path)

    assert export.directory == directory
    assert export.export_id == "01736985600000-a1b2c3d4"
    assert export.item_count == 5
    assert export.export_time == "2025-01-16T00:00:00.000Z"
    # The empty partition's file is listed, and left out of what the engine reads.
    assert [f.item_count for f in export.files] == [3, 2, 0]
    assert len(export_files(export)) == 2
    # The export directory itself, or its summary, name the same export.
    assert read_export(directory) == export
    assert read_export(directory / "manifest-summary.json") == export


def test_the_newest_export_under_a_directory_is_read(tmp_path: Path) -> None:
    older = write_aws_export(tmp_path, ITEMS, export_id="01736985600000-00000001")
    newer = write_aws_export(tmp_path, ITEMS[:2], export_id="01737072000000-00000002")
    rewrite_summary(older, exportTime="2025-01-15T00:00:00.000Z")
    rewrite_summary(newer, exportTime="2025-01-17T00:00:00.000Z")
    assert find_export(tmp_path) == newer


def test_a_damaged_data_file_is_named(tmp_path: Path) -> None:
    directory = write_aws_export(tmp_path, ITEMS)
    damaged = sorted((directory / "data").iterdir())[0]
    damaged.write_bytes(damaged.read_bytes()[:-3] + b"xyz")
    with pytest.raises(ExportError, match=rf"{damaged.name}: md5 .* damaged"):
        read_export(tmp_path)


def test_a_missing_data_file_is_named(tmp_path: Path) -> None:
    directory = write_aws_export(tmp_path, ITEMS)
    missing = sorted((directory / "data").iterdir())[1]
    missing.unlink()
    with pytest.raises(ExportError, match=missing.name):
        read_export(tmp_path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"itemCount": 6}, "itemCount 6 but manifest-files.json lists 5 items"),
        ({"outputFormat": "ION"}, "outputFormat 'ION': the audit reads DYNAMODB_JSON"),
        ({"exportType": "INCREMENTAL_EXPORT"}, "needs a full export"),
    ],
)
def test_an_export_the_audit_cannot_use_is_refused(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    rewrite_summary(write_aws_export(tmp_path, ITEMS), **changes)
    with pytest.raises(ExportError, match=message):
        read_export(tmp_path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"itemCount": 1}', "KeyError"),
        ("not json", "line 1"),
        (
            '{"itemCount": 1, "md5Checksum": "x", "dataFileS3Key": "AWSDynamoDB/other/data/a"}',
            "is not inside this export",
        ),
        (
            '{"itemCount": 1, "md5Checksum": "x", '
            '"dataFileS3Key": "AWSDynamoDB/01736985600000-a1b2c3d4/../../a"}',
            "leaves the export",
        ),
        (
            '{"itemCount": -1, "md5Checksum": "x", '
            '"dataFileS3Key": "AWSDynamoDB/01736985600000-a1b2c3d4/data/a"}',
            "itemCount -1 is not a count",
        ),
    ],
)
def test_a_bad_files_manifest_is_refused_naming_the_line(
    tmp_path: Path, line: str, message: str
) -> None:
    directory = write_aws_export(tmp_path, ITEMS)
    (directory / "manifest-files.json").write_text(line + "\n")
    with pytest.raises(ExportError, match=message):
        read_export(tmp_path)


def test_no_export_is_said_plainly(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="no DynamoDB export under it"):
        find_export(tmp_path)
    with pytest.raises(ExportError, match="no such file or directory"):
        find_export(tmp_path / "nowhere")
