"""The template's functions, run in process: the handler it names, with its environment.

Local mode and the tests call handlers exactly as template.yaml wires them, so a renamed
handler or a missing environment variable fails here before it fails in AWS.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tally.local.template import conditions, resource, template_path

Handler = Callable[[dict[str, Any], Any], Any]


@dataclass(frozen=True)
class Function:
    """One ``AWS::Serverless::Function`` as local mode needs it."""

    logical_id: str
    handler: str
    environment: dict[str, Any]
    timeout: int
    events: dict[str, Any]

    def load(self) -> Handler:
        module, _, name = self.handler.rpartition(".")
        target: Handler = getattr(importlib.import_module(module), name)
        return target


@dataclass(frozen=True)
class ColdStart:
    """A handler imported as Lambda imports it, and the modules that import made."""

    handler: Handler
    modules: dict[str, ModuleType]


def cold_start(spec: Function, values: Mapping[str, str]) -> ColdStart:
    """Import the handler afresh with its environment already set, as a Lambda cold start does.

    Powertools (service name, namespace, log level) and module-level state read the
    environment at import, so the handler's package is imported anew for each function:
    modules already imported in this process, with another environment, are not reused.
    """
    package = spec.handler.split(".", 1)[0]

    def own(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    outer = {name: module for name, module in sys.modules.items() if own(name)}
    for name in outer:
        del sys.modules[name]
    try:
        with variables(values):
            handler = spec.load()
        fresh = {name: module for name, module in sys.modules.items() if own(name)}
    finally:
        for name in [name for name in sys.modules if own(name)]:
            del sys.modules[name]
        sys.modules.update(outer)
    return ColdStart(handler, fresh)


def function(template: Mapping[str, Any], logical_id: str) -> Function:
    """The function's handler, merged environment (Globals, then its own) and events."""
    props = resource(template, logical_id, "AWS::Serverless::Function")["Properties"]
    defaults = template.get("Globals", {}).get("Function", {})
    environment = {
        **defaults.get("Environment", {}).get("Variables", {}),
        **props.get("Environment", {}).get("Variables", {}),
    }
    return Function(
        logical_id,
        props.get("Handler") or defaults["Handler"],
        environment,
        int(props.get("Timeout") or defaults.get("Timeout") or 3),
        props.get("Events", {}),
    )


def functions(template: Mapping[str, Any]) -> list[Function]:
    return [
        function(template, logical_id)
        for logical_id, body in template.get("Resources", {}).items()
        if body.get("Type") == "AWS::Serverless::Function"
    ]


def resolve(
    value: Any,
    names: Mapping[str, str],
    parameters: Mapping[str, str],
    conditions: Mapping[str, bool],
) -> str:
    """An environment value with ``Ref`` resolved to a local resource name or a parameter,
    and ``Fn::If`` to the branch its condition picks."""
    if isinstance(value, str | int | float | bool):
        return str(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(value, Mapping) and set(value) == {"Fn::If"}:
        condition, when_true, when_false = value["Fn::If"]
        branch = when_true if conditions[condition] else when_false
        return resolve(branch, names, parameters, conditions)
    if isinstance(value, Mapping) and set(value) == {"Fn::Join"}:
        # A list parameter is held as CloudFormation is given it: comma-separated.
        separator, items = value["Fn::Join"]
        if not isinstance(items, list):
            return resolve(items, names, parameters, conditions).replace(",", str(separator))
        return str(separator).join(resolve(i, names, parameters, conditions) for i in items)
    if isinstance(value, Mapping) and set(value) == {"Ref"}:
        ref = value["Ref"]
        if ref in names:
            return names[ref]
        if ref in parameters:
            return parameters[ref]
        raise KeyError(f"environment refers to {ref!r}, which local mode does not provide")
    raise ValueError(f"environment value {value!r} cannot be resolved locally")


def parameter_defaults(template: Mapping[str, Any]) -> dict[str, str]:
    return {
        name: str(spec["Default"])
        for name, spec in template.get("Parameters", {}).items()
        if "Default" in spec
    }


def environment(
    template: Mapping[str, Any],
    logical_id: str,
    names: Mapping[str, str],
    region: str = "us-east-1",
) -> dict[str, str]:
    """The function's environment as strings, resolved against local names and defaults in
    ``region`` (the stack's: local mode's is us-east-1 unless it runs several)."""
    parameters = parameter_defaults(template)
    chosen = conditions(template, parameters | {"AWS::Region": region})
    spec = function(template, logical_id)
    values = {
        key: resolve(value, names, parameters, chosen) for key, value in spec.environment.items()
    }
    # Declared-but-empty variables (the local endpoints) mean "unset": never clobber the caller's.
    values = {key: value for key, value in values.items() if value}
    # As in Lambda, the task root is the code directory: bundled files resolve against it.
    values["LAMBDA_TASK_ROOT"] = str(code_root(template, logical_id))
    return values


def bundled_rules(template: Mapping[str, Any]) -> Path:
    """The rules file the template bundles with the reconciler: its RULES_FILE under CodeUri."""
    spec = function(template, "ReconcilerFunction")
    return code_root(template, spec.logical_id) / str(spec.environment["RULES_FILE"])


def code_root(template: Mapping[str, Any], logical_id: str) -> Path:
    props = resource(template, logical_id, "AWS::Serverless::Function")["Properties"]
    code_uri: str = props.get("CodeUri") or template["Globals"]["Function"]["CodeUri"]
    return (template_path().parent / code_uri).resolve()


@contextlib.contextmanager
def variables(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the duration."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the duration, and this process's cached settings with them."""
    from tally.core.observability import metrics
    from tally.core.settings import settings
    from tally.handlers import writer_api
    from tally.reconciler import runtime

    caches = (
        settings,
        runtime.rules,
        runtime._clients,
        runtime._switch_parameter,
        writer_api._writers,
    )
    saved_metrics = metrics.namespace, metrics.service
    with variables(values):
        for cache in caches:
            cache.cache_clear()
        # Powertools reads its namespace and service (a dimension of every metric) when first
        # imported; Lambda sets them before that, a handler imported in this process only now.
        metrics.namespace = os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or metrics.namespace
        metrics.service = os.environ.get("POWERTOOLS_SERVICE_NAME") or metrics.service
        try:
            yield
        finally:
            for cache in caches:
                cache.cache_clear()
            metrics.namespace, metrics.service = saved_metrics
