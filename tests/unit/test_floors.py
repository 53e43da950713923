"""Imports never climb: each floor of src/tally imports only its own floor and those below.

ground (rules, settings, aws, dynamodb, numbers, streams, observability) -> writers -> reconciler
-> handlers -> local -> cli. What Lambda runs (everything below local) never imports local
mode or the CLI, and needs no package the Lambda layer does not ship.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tally

PACKAGE = Path(tally.__file__).parent
FLOORS = ["ground", "writers", "reconciler", "handlers", "local", "cli"]
GROUND = {
    "rules",
    "rules_model",
    "rules_validation",
    "key_patterns",
    "stream_filter",
    "live_table",
    "settings",
    "aws",
    "dynamodb",
    "numbers",
    "streams",
    "observability",
    "timefmt",
}
CLI = {"cli", "cli_options", "cli_rules", "rules_check", "rules_suggest", "console", "targets"}
# What the Lambda layer installs (layer/requirements.txt) or the Python runtime provides.
LAMBDA_PACKAGES = {"aws_lambda_powertools", "pydantic", "boto3", "botocore"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def floor(module: str) -> str:
    """The floor of a tally module (``tally`` itself is the ground)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in GROUND:
        return "ground"
    if parts[1] in CLI:
        return "cli"
    if parts[1] in FLOORS:
        return parts[1]
    raise AssertionError(f"{module} belongs to no floor: add it to the floors above")


def imports(module: str) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in the module, lazy ones included."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    yield from imports_in(MODULES[module].read_text(encoding="utf-8"), package)


def imports_in(source: str, package: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield node.lineno, base
            # `from tally import cli` imports a module, not a name
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    yield node.lineno, f"{base}.{alias.name}"


def test_every_module_has_a_floor() -> None:
    assert len(MODULES) > 20, "found too few modules: the walk is broken"
    for module in MODULES:
        floor(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_never_climb(module: str) -> None:
    own = FLOORS.index(floor(module))
    for line, target in imports(module):
        if target.split(".")[0] != "tally":
            continue
        above = FLOORS.index(floor(target))
        assert above <= own, (
            f"{MODULES[module].name}:{line}: {module} ({FLOORS[own]}) imports {target} "
            f"({FLOORS[above]}), a higher floor"
        )


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if FLOORS.index(floor(m)) < FLOORS.index("local"))
)
def test_lambda_code_needs_only_what_the_layer_ships(module: str) -> None:
    for line, target in imports(module):
        top = target.split(".")[0]
        if top == "tally" or top in sys.stdlib_module_names or top == "__future__":
            continue
        assert top in LAMBDA_PACKAGES, f"{MODULES[module].name}:{line}: {module} imports {top}"


def climbs(source: str, module: str) -> list[str]:
    own = FLOORS.index(floor(module))
    package = module.rpartition(".")[0]
    return [
        target
        for _, target in imports_in(source, package)
        if target.startswith("tally") and FLOORS.index(floor(target)) > own
    ]


def test_the_walk_catches_lazy_and_relative_climbs() -> None:
    source = "from tally.rules import load_rules\ndef f():\n    from ..local import stack\n"
    assert climbs(source, "tally.handlers.audit") == ["tally.local", "tally.local.stack"]
    assert climbs("import tally.cli\n", "tally.reconciler.replay") == ["tally.cli"]
    assert climbs("from tally.streams import StreamReader\n", "tally.reconciler.replay") == []
