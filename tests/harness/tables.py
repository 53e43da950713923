"""A throwaway table from template.yaml, for fixtures wider than one test."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from tally.local.template import create_table


@contextlib.contextmanager
def throwaway_table(dynamodb: Any, template: dict[str, Any]) -> Iterator[str]:
    """The template's `Table` under a fresh name, deleted afterwards."""
    name = f"tally-test-{uuid.uuid4().hex[:12]}"
    create_table(dynamodb, template, "Table", name)
    try:
        yield name
    finally:
        with contextlib.suppress(dynamodb.exceptions.ResourceNotFoundException):
            dynamodb.delete_table(TableName=name)
