"""Environment settings, validated once per cold start."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class SettingsError(ValueError):
    """A required environment variable is missing or malformed; the message names it."""


class Settings(BaseModel):
    """What the functions read from their environment; each reads the part it needs."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    table_name: str = Field(alias="TABLE_NAME", min_length=3, max_length=255)
    rules_file: str | None = Field(default=None, alias="RULES_FILE")
    audit_table_name: str | None = Field(default=None, alias="AUDIT_TABLE_NAME")
    alert_topic_arn: str | None = Field(default=None, alias="ALERT_TOPIC_ARN")
    recheck_queue_url: str | None = Field(default=None, alias="RECHECK_QUEUE_URL")
    stream_failure_queue_url: str | None = Field(default=None, alias="STREAM_FAILURE_QUEUE_URL")
    # The Glue database the export engine's Athena tables live in.
    athena_database: str | None = Field(default=None, alias="ATHENA_DATABASE")
    # The repair switches (the kill switch, dry run, the per-invocation budget): an SSM
    # parameter's, read at run time and kept this many seconds per warm container...
    repair_switches_parameter: str | None = Field(default=None, alias="REPAIR_SWITCHES_PARAMETER")
    repair_switches_max_age: int = Field(
        default=30, ge=0, le=300, alias="REPAIR_SWITCHES_MAX_AGE_SECONDS"
    )
    # ... else these (a function run without the template: tests, a plain environment).
    repairs_enabled: bool = Field(default=True, alias="REPAIRS_ENABLED")
    dry_run: bool = Field(default=False, alias="DRY_RUN")
    repair_budget: int = Field(default=25, ge=0, alias="REPAIR_BUDGET")
    # A finding left standing (alert-only rules) is alerted once; 0 never reminds.
    alert_reminder_hours: int = Field(default=0, ge=0, alias="ALERT_REMINDER_HOURS")
    # How long a hot parent's remainder may wait for the batch that cancels it (SQS: whole s).
    carry_seconds: int = Field(default=5, ge=0, le=900, alias="CARRY_SECONDS")
    # The stream mapping's ParallelizationFactor: above 1, records of one item collection
    # may be verified out of order in concurrent batches, which the carry cannot fold.
    parallelization_factor: int = Field(default=1, ge=1, le=10, alias="PARALLELIZATION_FACTOR")
    # Item collections of one batch verified at once: each mostly waits on DynamoDB, so a
    # batch touching many parents takes about as long as its slowest parent, not their sum.
    verify_concurrency: int = Field(default=16, ge=1, le=32, alias="VERIFY_CONCURRENCY")
    # A Global Table (docs/global-tables.md): its Regions, comma-separated (unset: a
    # single-Region table, as ever); this function's Region (Lambda sets AWS_REGION); the
    # Region that judges every parent (default the first listed); how long replication is
    # given to settle before an imbalance is evidence; whether the table is MREC ("eventual")
    # or MRSC ("strong": no transaction may touch it, so a repair writes the counter alone and
    # its audit items apart, docs/verification.md); and after how many repairs in 24 h a
    # parent written from several Regions is escalated as contended instead of repaired.
    global_regions: str | None = Field(default=None, alias="GLOBAL_REGIONS")
    aws_region: str | None = Field(default=None, alias="AWS_REGION")
    home_region: str | None = Field(default=None, alias="HOME_REGION")
    settle_seconds: int = Field(default=60, ge=1, le=900, alias="SETTLE_SECONDS")
    contended_after_repairs: int = Field(default=3, ge=1, le=1000, alias="CONTENDED_AFTER_REPAIRS")
    # How often each Region's heartbeat is scheduled (the template's rate; the local pump
    # beats at the local stack's): a link silent longer than the settle window and this is
    # stalled.
    heartbeat_seconds: int = Field(default=60, ge=1, le=3600, alias="HEARTBEAT_SECONDS")
    global_consistency: Literal["eventual", "strong"] = Field(
        default="eventual", alias="GLOBAL_CONSISTENCY"
    )

    @model_validator(mode="after")
    def _one_of_the_regions(self) -> Settings:
        if not self.global_regions:
            if self.global_consistency == "strong":
                raise ValueError("GLOBAL_CONSISTENCY=strong: a Global Table, set GLOBAL_REGIONS")
            return self
        regions = [r.strip() for r in self.global_regions.split(",") if r.strip()]
        if len(set(regions)) < 2 or len(set(regions)) != len(regions):
            raise ValueError("GLOBAL_REGIONS: two or more distinct Regions, comma-separated")
        if self.aws_region not in regions:
            raise ValueError("AWS_REGION: this function's Region must be one of GLOBAL_REGIONS")
        if self.home_region and self.home_region not in regions:
            raise ValueError("HOME_REGION: one of GLOBAL_REGIONS")
        return self

    def regions(self) -> list[str]:
        """The Global Table's Regions ([] for a single-Region table)."""
        return [r.strip() for r in (self.global_regions or "").split(",") if r.strip()]

    def require(self, name: str) -> str:
        """A setting the calling function cannot work without; names the variable if unset."""
        value = getattr(self, name)
        if not value:
            alias = type(self).model_fields[name].alias
            raise SettingsError(f"environment variable {alias} is not set")
        return str(value)


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The environment's settings; a SettingsError naming each bad variable, never its values."""
    try:
        return Settings.model_validate(dict(os.environ))
    except ValidationError as error:
        # pydantic's own message repeats its input: the whole environment, secrets included.
        problems = [
            f"environment variable {detail['loc'][0]} "
            + ("is not set" if detail["type"] == "missing" else f"is invalid: {detail['msg']}")
            if detail["loc"]
            # A check across variables names them in its own message.
            else str(detail["msg"]).removeprefix("Value error, ")
            for detail in error.errors()
        ]
        raise SettingsError("; ".join(problems)) from None
