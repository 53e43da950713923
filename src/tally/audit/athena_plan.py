"""The export engine in AWS: the Athena statements that audit one completed table export.

The state machine exports the table, waits for the export, and hands its description
(``DescribeExport``'s ``ExportDescription``) here; it gets back the DDL that makes the
export's data files a table, the audit query over that table, and the DDL that drops the
table again. The data stays where DynamoDB wrote it: ``<prefix>/AWSDynamoDB/<id>/data/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tally.audit.sql import AuditQuery
from tally.rules import RuleSet

_EXPORT_ARN = re.compile(r"^arn:[^:]+:dynamodb:[^:]*:\d*:table/[^/]+/export/(?P<id>[0-9a-zA-Z-]+)$")


class ExportDescription(BaseModel):
    """The fields of ``DescribeExport``'s ``ExportDescription`` the plan needs."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ExportArn: str = Field(pattern=_EXPORT_ARN.pattern)
    ExportStatus: Literal["COMPLETED"]
    S3Bucket: str = Field(min_length=3)
    S3Prefix: str = ""
    ExportFormat: Literal["DYNAMODB_JSON"] = "DYNAMODB_JSON"
    ExportType: Literal["FULL_EXPORT"] = "FULL_EXPORT"
    ItemCount: int = Field(default=0, ge=0)


@dataclass(frozen=True)
class AthenaPlan:
    """The statements, in the order the state machine runs them."""

    export_id: str
    table: str
    location: str
    create: str
    query: str
    drop: str


def plan(description: ExportDescription, rules: RuleSet, database: str) -> AthenaPlan:
    """Statements auditing every rule not switched off over the export ``description`` names."""
    match = _EXPORT_ARN.match(description.ExportArn)
    assert match is not None  # the model's pattern
    export_id = match["id"]
    prefix = description.S3Prefix.strip("/")
    location = f"s3://{description.S3Bucket}/{prefix + '/' if prefix else ''}"
    location += f"AWSDynamoDB/{export_id}/data/"
    query = AuditQuery([r for r in rules if r.repair != "off"], rules.table)
    name = "export_" + export_id.lower().replace("-", "_")
    return AthenaPlan(
        export_id=export_id,
        table=name,
        location=location,
        create=query.athena_table(database, name, location),
        query=query.sql(f'"{database}"."{name}"'),
        drop=f"DROP TABLE IF EXISTS `{database}`.`{name}`",
    )
