"""The pump's stream checkpoint: per shard, the last record the handler settled.

It is written atomically (a temporary file, fsync, then a rename), so a crash while saving
leaves the previous checkpoint whole. A checkpoint that cannot be read anyway (edited by
hand, a disk fault) is set aside and the pump starts again from the trim horizon: every
record still in the stream is verified again, which repeats work but never skips a record.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

CORRUPT_SUFFIX = ".corrupt"
_NUMBER = re.compile(r"[0-9]+")


class Checkpoint:
    """One checkpoint file: shard id -> sequence number of the last settled record."""

    def __init__(self, path: Path, say: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.say = say or (lambda _: None)

    def load(self) -> dict[str, str]:
        """The saved positions; none if there is no file, or if it cannot be read."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            return _positions(json.loads(raw))
        except ValueError as error:
            aside = self.path.with_name(self.path.name + CORRUPT_SUFFIX)
            os.replace(self.path, aside)
            self.say(
                f"pump: checkpoint {self.path} is unreadable ({error}); moved to {aside.name}, "
                "reading every shard again from the trim horizon"
            )
            return {}

    def save(self, positions: Mapping[str, str]) -> None:
        """Replace the checkpoint with ``positions``, all or nothing."""
        staging = self.path.with_name(self.path.name + ".tmp")
        with staging.open("w") as out:
            json.dump(dict(positions), out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, self.path)


def _positions(value: object) -> dict[str, str]:
    """The checkpoint's content, checked: shard ids mapped to numeric sequence numbers."""
    if not isinstance(value, dict):
        raise ValueError(f"expected an object of shard positions, got {type(value).__name__}")
    for shard_id, sequence_number in value.items():
        if not isinstance(sequence_number, str) or not _NUMBER.fullmatch(sequence_number):
            raise ValueError(f"shard {shard_id!r} has no sequence number: {sequence_number!r}")
    return dict(value)
