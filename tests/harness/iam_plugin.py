"""Record the functions' AWS calls over any test run: ``TALLY_RECORD_CALLS=calls.jsonl pytest
-p tests.harness.iam_plugin tests/integration/test_live_faults.py``, then
``python -m tests.harness.iam_report calls.jsonl`` lists them and checks them against the
template's policies (tests/integration/test_iam.py records its own scenarios without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tally.local.template import load_template, template_path
from tests.harness.iam_calls import Recorder, environment_roles

_RECORDER: list[Recorder] = []


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get("TALLY_RECORD_CALLS")
    if not out:
        return
    template = load_template(template_path())
    handlers = {
        body["Properties"]["Handler"]: name
        for name, body in template["Resources"].items()
        if body["Type"] == "AWS::Serverless::Function"
    }
    recorder = Recorder(handlers, environment_roles(template), Path(out))
    recorder.install()
    _RECORDER.append(recorder)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _RECORDER:
        _RECORDER.pop().uninstall()
