"""The protocol's decisions are functions of values: importing them loads no AWS SDK, and no
module of the package reads a clock, draws a random number or imports the I/O around it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import tally.reconciler.protocol as protocol

PACKAGE = Path(protocol.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
CLOCKS = {"time", "random", "secrets", "uuid"}


def test_importing_every_protocol_module_loads_no_sdk() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {MODULES!r}:\n"
        "    importlib.import_module('tally.reconciler.protocol.' + name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('boto3', 'botocore', 'moto', 's3transfer'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert MODULES and json.loads(out.stdout) == []


def test_no_protocol_module_reads_a_clock_or_imports_the_io_around_it() -> None:
    for name in MODULES:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                imported = [node.module or ""]
            else:
                if isinstance(node, ast.Attribute):
                    assert node.attr not in {"now", "utcnow", "today"}, f"{name} reads a clock"
                continue
            for module in imported:
                assert module.split(".")[0] not in CLOCKS, f"{name} imports {module}"
                if module.startswith("tally."):
                    allowed = (
                        "tally.core.numbers",
                        "tally.core.stamps",
                        "tally.core.regions",
                        "tally.rules",
                        "tally.reconciler.protocol",
                    )
                    assert module.startswith(allowed), f"{name} imports {module}"
