"""Options and arguments several ``tally`` commands share: the target, the rules file, and
files named on the command line."""

from __future__ import annotations

import argparse
import errno
import os
import stat
from pathlib import Path

from tally.cli.console import UsageError

EPILOG = "exit codes: 0 clean, 1 findings or failure, 2 usage"


def target_options(parser: argparse.ArgumentParser) -> None:
    """``--stack`` and ``--rules``: what a command works on."""
    parser.add_argument("--stack", metavar="NAME", help="a deployed stack (default: local stack)")
    rules_option(parser)


def rules_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules",
        type=Path,
        metavar="PATH",
        help="the rules file (default: $RULES_FILE, else the local stack's, else the bundled ones)",
    )


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
