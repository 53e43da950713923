"""Imports never climb: each floor of src/tally imports only its own floor and those below.

A module's floor is its package under tally: core -> rules -> writers -> reconciler -> audit ->
handlers -> local -> cli (``tally`` itself is the ground). Inside the reconciler, its rooms
stand the same way (``ROOMS``). What Lambda runs (everything below local) never
imports local mode or the CLI, and needs no package the Lambda layer does not ship.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import tally

PACKAGE = Path(tally.__file__).parent
FLOORS = ["core", "rules", "writers", "reconciler", "audit", "handlers", "local", "cli"]
# What the Lambda layer installs (layer/requirements.txt) or the Python runtime provides.
LAMBDA_PACKAGES = {"aws_lambda_powertools", "pydantic", "boto3", "botocore"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def floor(module: str) -> str:
    """The floor of a tally module: its first package under tally (``tally`` itself: core)."""
    parts = module.split(".")
    if len(parts) == 1:
        return FLOORS[0]
    if parts[1] in FLOORS:
        return parts[1]
    raise AssertionError(f"{module} belongs to no floor: put it in one of the packages {FLOORS}")


def package_of(module: str) -> str:
    """What a relative import in the module starts from: itself if a package, else its parent."""
    is_package = module in MODULES and MODULES[module].name == "__init__.py"
    return module if is_package else module.rpartition(".")[0]


def imports(module: str) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in the module, lazy ones included."""
    yield from imports_in(MODULES[module].read_text(encoding="utf-8"), package_of(module))


def imports_in(source: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every import. ``from package import module`` imports both: the
    module is reached through the package's names, which a package still running its
    ``__init__`` may not hold yet. ``import package.module`` reaches it by its path; the
    package's ``__init__`` runs first either way, and counts where it imports its modules."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from tally import cli` imports a module, not a name
            modules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            yield node.lineno, base
            for module in modules:
                yield node.lineno, module


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


# The reconciler's rooms, lowest first (docs/verification.md): a package, or a module of its own.
ROOMS = [
    "protocol",
    "findings",
    "stats",
    "table",
    "store",
    "stream",
    "report",
    "repair",
    "checks",
    "verification",
    "runtime",
    "replay",
]
RECONCILER = "tally.reconciler"


def room(module: str) -> str | None:
    """A reconciler module's room (None: the package itself, the ground, or outside it)."""
    if not module.startswith(RECONCILER + "."):
        return None
    first = module[len(RECONCILER) + 1 :].split(".")[0]
    assert first in ROOMS, f"{module} is in no room: put it in one of {ROOMS}"
    return first


@pytest.mark.parametrize("module", sorted(m for m in MODULES if room(m) is not None))
def test_the_reconcilers_rooms_import_only_the_rooms_below_them(module: str) -> None:
    own = ROOMS.index(room(module) or "")
    for line, target in imports(module):
        above = room(target)
        if above is not None:
            assert ROOMS.index(above) <= own, (
                f"{MODULES[module].name}:{line}: {module} ({ROOMS[own]}) imports {target} "
                f"({above}), a room above it"
            )


def test_every_package_says_which_part_it_is() -> None:
    """Each package's docstring names its part: the document, or the section of one."""
    packages = [m for m, path in MODULES.items() if path.name == "__init__.py" and m != "tally"]
    assert {"tally.reconciler.checks", "tally.audit"} <= set(packages)
    for package in packages:
        doc = ast.get_docstring(ast.parse(MODULES[package].read_text(encoding="utf-8")))
        assert doc, f"{package} has no docstring"
        if package.startswith(RECONCILER + ".") or package == "tally.audit":
            assert "docs/" in doc, f"{package}'s docstring names no part of the docs"


def test_the_walk_catches_lazy_and_relative_climbs() -> None:
    source = "from tally.rules import load_rules\ndef f():\n    from ..local import stack\n"
    assert climbs(source, "tally.handlers.audit") == ["tally.local", "tally.local.stack"]
    assert climbs("import tally.cli\n", "tally.reconciler.replay") == ["tally.cli"]
    assert climbs("from tally.core.streams import StreamReader\n", "tally.reconciler.replay") == []


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import one another, directly or through others (Tarjan)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = []
            while (member := stack.pop()) != module:
                group.append(member)
            if group:
                found.append(sorted([module, *group]))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(found)


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """Which of these modules (name -> source) each imports, lazy imports included."""
    return {
        module: {
            target
            for _, target in imports_in(source, package_of(module))
            if target in sources and target != module
        }
        for module, source in sources.items()
    }


def test_no_modules_import_each_other() -> None:
    """Imports go one way, lazy ones included: no two modules import each other, directly or
    through a chain of others."""
    found = circles(
        import_graph({m: path.read_text(encoding="utf-8") for m, path in MODULES.items()})
    )
    assert not found, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_walk_finds_direct_and_chained_circles() -> None:
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert circles(graph) == [["a", "b"], ["c", "d", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_circle_walk_finds_a_package_reached_from_its_own_modules() -> None:
    """A package that re-exports a module's names, and a module that reaches a sibling through
    the package (``from tally.writers import items``), import each other."""
    sources = {
        "tally.writers": "from tally.writers.tallies import TallyWriter\n",
        "tally.writers.tallies": "from tally.writers import items\n",
        "tally.writers.items": "",
    }
    assert circles(import_graph(sources)) == [["tally.writers", "tally.writers.tallies"]]
    sources["tally.writers.tallies"] = "import tally.writers.items as items\n"
    assert circles(import_graph(sources)) == []
