"""The pump's stream checkpoint: per shard, the last record the handler settled.

It names its stream: a checkpoint of another stream (the table or the local stack was
created anew since) is not used, and the new stream is read from its trim horizon. It is
written atomically (a temporary file, fsync, then a rename), so a crash while saving
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
    """One stream's checkpoint file: shard id -> sequence number of the last settled record."""

    def __init__(self, path: Path, stream_arn: str, say: Callable[[str], None] | None = None):
        self.path = path
        self.stream_arn = stream_arn
        self.say = say or (lambda _: None)

    def load(self) -> dict[str, str]:
        """The saved positions; none if there is no file, it is another stream's, or unreadable."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            stream_arn, positions = _checkpoint(json.loads(raw))
        except ValueError as error:
            aside = self.path.with_name(self.path.name + CORRUPT_SUFFIX)
            os.replace(self.path, aside)
            self.say(
                f"pump: checkpoint {self.path} is unreadable ({error}); moved to {aside.name}, "
                "reading every shard again from the trim horizon"
            )
            return {}
        if stream_arn != self.stream_arn:
            self.say(
                f"pump: checkpoint {self.path} is for another stream ({stream_arn}); "
                "reading this one from the trim horizon"
            )
            return {}
        return positions

    def save(self, positions: Mapping[str, str]) -> None:
        """Replace the checkpoint with ``positions``, all or nothing."""
        staging = self.path.with_name(self.path.name + ".tmp")
        with staging.open("w") as out:
            json.dump({"streamArn": self.stream_arn, "shards": dict(positions)}, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, self.path)


def _checkpoint(value: object) -> tuple[str, dict[str, str]]:
    """The checkpoint's stream and shard positions, checked."""
    if not isinstance(value, dict) or set(value) != {"streamArn", "shards"}:
        raise ValueError("expected an object with streamArn and shards")
    stream_arn, shards = value["streamArn"], value["shards"]
    if not isinstance(stream_arn, str) or not isinstance(shards, dict):
        raise ValueError("streamArn must be a string and shards an object")
    for shard_id, sequence_number in shards.items():
        if not isinstance(sequence_number, str) or not _NUMBER.fullmatch(sequence_number):
            raise ValueError(f"shard {shard_id!r} has no sequence number: {sequence_number!r}")
    return stream_arn, dict(shards)
