"""Options and arguments several ``tally`` commands share: the target, the rules file, files
named on the command line, and the types of arguments (segments, seconds, keys)."""

from __future__ import annotations

import argparse
import errno
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path

import shtab

from tally.cli.console import UsageError

EPILOG = "exit codes: 0 clean, 1 findings or failure, 2 usage"


def target_options(parser: argparse.ArgumentParser) -> None:
    """``--stack`` and ``--rules``: what a command works on."""
    parser.add_argument("--stack", metavar="NAME", help="a deployed stack (default: local stack)")
    rules_option(parser)


def rules_option(parser: argparse.ArgumentParser) -> None:
    rules = parser.add_argument(
        "--rules",
        type=Path,
        metavar="PATH",
        help="the rules file (default: $RULES_FILE, else the local stack's, else the bundled ones)",
    )
    completes(rules, shtab.FILE)


def completes(action: argparse.Action, kind: Mapping[str, object]) -> None:
    """Tab completion (``tally completion``) offers files (``shtab.FILE``) or directories
    (``shtab.DIRECTORY``) for ``action``'s value."""
    action.complete = kind  # type: ignore[attr-defined]


def rules_file(options: argparse.Namespace) -> Path | None:
    """The rules file the user named (``--rules``, else ``RULES_FILE``), or None.

    UsageError when it names no file (missing, a directory, a symlink loop).
    """
    if given := getattr(options, "rules", None):
        return named_file(given, "--rules")
    if from_environment := os.environ.get("RULES_FILE"):
        return named_file(Path(from_environment), "RULES_FILE=")
    return None


def named_file(path: Path, option: str) -> Path:
    """``path`` resolved, when it names something to read; UsageError saying what it names."""
    shown = f"{option}{path}" if option.endswith("=") else f"{option} {path}"
    try:
        resolved = path.resolve()
        mode = resolved.stat().st_mode
    except RuntimeError:  # Python 3.11's resolve() on a symlink loop
        raise UsageError(f"{shown}: a symlink loop") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UsageError(f"{shown}: a symlink loop") from None
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            raise UsageError(f"{shown}: no such file") from None
        raise UsageError(f"{shown}: {error.strerror or error}") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"{shown}: a directory, not a file")
    return resolved


MAX_SEGMENTS = 64


def segment_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_SEGMENTS:
        raise argparse.ArgumentTypeError(f"a whole number from 1 to {MAX_SEGMENTS}, not {text!r}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"a number of seconds above 0, not {text!r}")
    return value


def key_argument(text: str) -> dict[str, str]:
    try:
        return parse_key(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_key(text: str) -> dict[str, str]:
    """``PK=POST#a91f,SK=META`` as a key; ValueError saying what is malformed."""
    key: dict[str, str] = {}
    for part in text.split(","):
        name, equals, value = part.partition("=")
        if not equals:
            raise ValueError(f"{part!r} is not NAME=VALUE (e.g. PK=POST#a91f,SK=META)")
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"{name!r} is not an attribute name (no spaces: PK=...,SK=...)")
        if not value:
            raise ValueError(f"{name} has no value")
        if value != value.strip():
            raise ValueError(f"the value of {name}, {value!r}, starts or ends with a space")
        if name in key:
            raise ValueError(f"{name} is given twice")
        key[name] = value
    return key
