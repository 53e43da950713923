"""What `sam build` packages for each function (src/Makefile): the code below local mode and
the bundled rules, nothing else; and every handler imports from that package alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tally.local.functions import functions
from tally.local.template import load_template, template_path
from tests.unit.project.test_floors import FLOORS, MODULES, floor

TEMPLATE = load_template(template_path())
SOURCE = template_path().parent / "src"


def build(logical_id: str, artifacts: Path) -> Path:
    """Run the recipe `sam build` runs for the function (it sets ARTIFACTS_DIR the same way)."""
    subprocess.run(
        ["make", "--no-print-directory", f"build-{logical_id}", f"ARTIFACTS_DIR={artifacts}"],
        cwd=SOURCE,
        check=True,
        capture_output=True,
    )
    return artifacts


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("ReconcilerFunction", tmp_path_factory.mktemp("ReconcilerFunction"))


def test_the_package_holds_the_lambda_floors_and_the_rules(package: Path) -> None:
    shipped = {
        ".".join(path.relative_to(package).with_suffix("").parts).removesuffix(".__init__")
        for path in package.rglob("*.py")
    }
    lambda_code = {m for m in MODULES if FLOORS.index(floor(m)) < FLOORS.index("local")}
    assert shipped == lambda_code
    assert sorted(p.name for p in package.iterdir()) == ["rules.toml", "tally"]
    assert not list(package.rglob("__pycache__"))


def test_every_function_gets_the_same_package(package: Path, tmp_path: Path) -> None:
    contents = sorted(str(p.relative_to(package)) for p in package.rglob("*"))
    for spec in functions(TEMPLATE):
        built = build(spec.logical_id, tmp_path / spec.logical_id)
        assert sorted(str(p.relative_to(built)) for p in built.rglob("*")) == contents


def test_every_handler_imports_from_the_package_alone(package: Path) -> None:
    modules = [spec.handler.rpartition(".")[0] for spec in functions(TEMPLATE)]
    # The package first on the path, as /var/task is in Lambda; dependencies from this venv.
    script = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(package)!r})\n"
        f"for module in {modules!r}: importlib.import_module(module)\n"
        "loaded = [m.__file__ for n, m in sys.modules.items() if n.startswith('tally')]\n"
        f"outside = [f for f in loaded if f and not f.startswith({str(package)!r})]\n"
        "assert not outside, outside\n"
        "assert 'tally.local' not in sys.modules and 'tally.cli' not in sys.modules\n"
    )
    environment = {"POWERTOOLS_SERVICE_NAME": "tally", "POWERTOOLS_TRACE_DISABLED": "true"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_the_size_docs_operations_states_is_the_built_package_s(package: Path) -> None:
    """docs/operations.md states the function package's size (the one place docs do), to
    within a tenth of it: the files' bytes, and zipped as `sam deploy` uploads it."""
    import io
    import re
    import zipfile

    page = (template_path().parent / "docs" / "operations.md").read_text()
    found = re.search(
        r"\| each of the six functions \|.*\| ([\d.]+) MB \(([\d.]+) MB zipped\) \|", page
    )
    assert found, "docs/operations.md: the function package's row is gone"
    stated, stated_zipped = float(found.group(1)), float(found.group(2))
    # Without the bytecode the import tests above leave behind (the build ships none).
    files = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    size = sum(p.stat().st_size for p in files) / 1e6
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, path.relative_to(package))
    zipped = len(buffer.getvalue()) / 1e6
    assert abs(size - stated) <= size / 10, (size, stated)
    assert abs(zipped - stated_zipped) <= zipped / 10, (zipped, stated_zipped)
