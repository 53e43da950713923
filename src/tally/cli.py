"""The ``tally`` command."""

from __future__ import annotations

import argparse
import sys

from tally.local import dynamodb_local


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tally", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    ddb = commands.add_parser(
        "dynamodb-local", help="fetch or run DynamoDB Local (the AWS emulator, no Docker)"
    )
    ddb.add_argument("args", nargs=argparse.REMAINDER, help="fetch | run [--port N]")
    options = parser.parse_args(argv)
    if options.command == "dynamodb-local":
        return dynamodb_local.main(options.args)
    parser.error(f"unknown command {options.command}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
