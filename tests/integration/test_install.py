"""`pip install .` (not editable): the installed tally serves the project in its working
directory, its template and rules, and never looks for them next to the installed package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tally.local.template import template_path
from tests.integration.conftest import Stack

ROOT = template_path().parent
LIKES_ONLY = """
[table]
partition_key = "PK"
sort_key = "SK"

[[rules]]
name = "likes"
kind = "count"
parent = { PK = "POST#*", SK = "META" }
children = { SK = "LIKE#*" }
counter = "likeTally"
revision = "tallyRevision"
repair = "auto"
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install .`: the wheel built from the checkout, installed into a directory of its own."""
    site = tmp_path_factory.mktemp("install") / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-build-isolation", "--target", str(site), str(ROOT)],
        check=True,
        capture_output=True,
    )
    return site


def tally(
    site: Path, cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    # The installed copy comes first on the path, before this checkout's editable install.
    env = env | {"PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-m", "tally.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_wheel_ships_code_not_a_project(installed: Path) -> None:
    assert (installed / "tally" / "cli" / "app.py").is_file()
    assert not list(installed.rglob("template.yaml")) and not list(installed.rglob("*.toml"))
    located = subprocess.run(
        [sys.executable, "-c", "import tally.cli; print(tally.cli.__file__)"],
        env=dict(os.environ) | {"PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert located.stdout.startswith(str(installed))


def test_the_installed_tally_audits_the_working_directorys_project(
    installed: Path, stack: Stack, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    shutil.copy(ROOT / "template.yaml", project / "template.yaml")
    (project / "src" / "rules.toml").write_text(LIKES_ONLY)
    env = {k: v for k, v in os.environ.items() if k not in ("TALLY_TEMPLATE", "RULES_FILE")}
    env["TALLY_STATE_DIR"] = str(tmp_path / "state")
    stack.put({"PK": "POST#1", "SK": "META", "likeTally": 0})

    which = tally(installed, project, env, "--version")
    assert which.returncode == 0 and which.stdout.startswith("tally ")
    result = tally(installed, project, env, "audit", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["rules"] == ["likes"]  # the project's rules file, not the checkout's
    assert report["parents_checked"] == {"likes": 1}

    elsewhere = tally(installed, tmp_path, env, "audit")
    assert elsewhere.returncode == 2
    assert f"tally: no template.yaml in {tmp_path}: run tally in the project's directory" in (
        elsewhere.stderr
    )
    named = tally(
        installed, tmp_path, env, "audit", "--json", "--template", "project/template.yaml"
    )
    assert named.returncode == 0 and json.loads(named.stdout)["rules"] == ["likes"]
