"""Local functions start as Lambda starts them: environment first, then a fresh import."""

from __future__ import annotations

import os
import sys

import tally.core.observability
from tally.local.functions import cold_start, function
from tally.local.template import load_template, template_path

TEMPLATE = load_template(template_path())


def test_powertools_reads_the_functions_environment_not_the_callers() -> None:
    caller = {
        name: os.environ.get(name)
        for name in ("POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE")
    }
    started = cold_start(
        function(TEMPLATE, "RecheckFunction"),
        {"POWERTOOLS_SERVICE_NAME": "checkout", "POWERTOOLS_METRICS_NAMESPACE": "Shop"},
    )
    observability = started.modules["tally.core.observability"]
    assert observability.logger.service == "checkout"
    assert observability.metrics.service == "checkout"
    assert observability.metrics.namespace == "Shop"
    assert started.handler is started.modules["tally.handlers.recheck"].handler

    # This process keeps its own modules and its own environment.
    assert observability is not tally.core.observability
    assert sys.modules["tally.core.observability"] is tally.core.observability
    assert {name: os.environ.get(name) for name in caller} == caller


def test_each_function_has_modules_of_its_own() -> None:
    reconciler = cold_start(
        function(TEMPLATE, "ReconcilerFunction"), {"POWERTOOLS_SERVICE_NAME": "left"}
    )
    recheck = cold_start(
        function(TEMPLATE, "RecheckFunction"), {"POWERTOOLS_SERVICE_NAME": "right"}
    )
    assert reconciler.modules["tally.core.settings"] is not recheck.modules["tally.core.settings"]
    assert reconciler.modules["tally.core.observability"].logger.service == "left"
    assert recheck.modules["tally.core.observability"].logger.service == "right"
