"""Environment settings, validated once per cold start."""

from __future__ import annotations

import os
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field


class Settings(BaseModel):
    """What every function reads from its environment."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    table_name: str = Field(alias="TABLE_NAME", min_length=3, max_length=255)
    rules_file: str | None = Field(default=None, alias="RULES_FILE")


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings.model_validate(dict(os.environ))
