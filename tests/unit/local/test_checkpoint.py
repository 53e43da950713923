"""The pump's checkpoint file: one stream's, written all or nothing, never a reason to stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tally.local.checkpoint import CORRUPT_SUFFIX, Checkpoint

STREAM = "arn:aws:dynamodb:ddblocal:000000000000:table/t/stream/2026-01-01T00:00:00.000"
POSITIONS = st.dictionaries(
    st.text(min_size=1, max_size=40), st.integers(0, 10**24).map(str), max_size=5
)


@given(POSITIONS)
def test_what_is_saved_is_loaded(positions: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = Checkpoint(Path(directory) / "checkpoint.json", STREAM)
        checkpoint.save(positions)
        assert checkpoint.load() == positions
        assert [p.name for p in Path(directory).iterdir()] == ["checkpoint.json"]


@given(st.binary(max_size=200))
def test_any_unreadable_content_means_starting_over_never_an_error(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "checkpoint.json"
        path.write_bytes(content)
        said: list[str] = []
        positions = Checkpoint(path, STREAM, said.append).load()
        if path.exists():  # it was a checkpoint after all
            saved = json.loads(content)
            assert positions == (saved["shards"] if saved["streamArn"] == STREAM else {})
        else:  # set aside for a look, and said so: the pump re-reads from the trim horizon
            assert positions == {}
            assert path.with_name(path.name + CORRUPT_SUFFIX).read_bytes() == content
            assert "trim horizon" in said[0]


def test_a_truncated_checkpoint_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, STREAM).save({"shardId-0001": "4200000000000000000001"})
    path.write_bytes(path.read_bytes()[:17])
    said: list[str] = []
    assert Checkpoint(path, STREAM, said.append).load() == {}
    assert "unreadable" in said[0]
    assert Checkpoint(path, STREAM).load() == {}  # and the next pump starts quietly from scratch


def test_another_streams_checkpoint_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, STREAM.replace("2026", "2025")).save({"shardId-0001": "7"})
    said: list[str] = []
    assert Checkpoint(path, STREAM, said.append).load() == {}
    assert "another stream" in said[0]


def test_a_crash_between_write_and_rename_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, STREAM).save({"shardId-0001": "100"})
    crash = (
        "import os, pathlib, signal, sys\n"
        "from tally.local.checkpoint import Checkpoint\n"
        "os.replace = lambda *_: os.kill(os.getpid(), signal.SIGKILL)\n"
        "Checkpoint(pathlib.Path(sys.argv[1]), sys.argv[2]).save({'shardId-0001': '200'})\n"
    )
    result = subprocess.run([sys.executable, "-c", crash, str(path), STREAM], timeout=60)
    assert result.returncode == -signal.SIGKILL
    assert Checkpoint(path, STREAM).load() == {"shardId-0001": "100"}
    # The new positions were written in full beside it; the next save simply writes again.
    staged = json.loads(path.with_name(path.name + ".tmp").read_text())
    assert staged["shards"] == {"shardId-0001": "200"}
    Checkpoint(path, STREAM).save({"shardId-0001": "300"})
    assert Checkpoint(path, STREAM).load() == {"shardId-0001": "300"}
