"""Every AWS call the functions' code makes, recorded through boto3's event system.

``Recorder.install()`` registers a ``provide-client-params`` handler on boto3's default
session (where ``tally.core.aws.client`` makes every client), so each client made afterwards
reports each API call once (retries are not calls). A call is attributed to the template's
function whose handler is running: the innermost ``handler`` frame of a ``tally.handlers``
module on the stack (the tests' Lambda emulation and local mode's runner both call the
handler itself), or the function named by ``acting_as``; calls made in an executor's thread
inherit the submitting thread's function. Calls outside every function (the tests' own
set-up, the pump's stream reads) are not recorded.

Each call becomes the IAM requests it needs: a transaction or batch is one request per item
or table, with the item's action (``TransactWriteItems``' Put is ``dynamodb:PutItem``). The
resource is named by the template's logical id, found through the function's environment
(``TABLE_NAME`` holds the table ``Table`` stands for...), so the same evidence can be checked
against any deployment. For DynamoDB item calls the attributes the request names (item,
key, update, condition and projection expressions) are kept for ``dynamodb:Attributes``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import json
import os
import re
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import boto3

import tally

ACTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("acting", default=None)
_TALLY = str(Path(tally.__file__).resolve().parent)
_HANDLERS = os.path.join(_TALLY, "handlers")
_TRANSACT = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
    "Get": "GetItem",
}
_EXPRESSION_WORDS = {
    "SET", "REMOVE", "ADD", "DELETE", "AND", "OR", "NOT", "BETWEEN", "IN",
    "if_not_exists", "list_append", "attribute_exists", "attribute_not_exists",
    "attribute_type", "begins_with", "contains", "size",
}  # fmt: skip


@dataclass(frozen=True)
class Call:
    """One IAM request a function's code made, as recorded."""

    function: str
    operation: str  # the API operation: TransactWriteItems
    action: str  # the IAM action: dynamodb:PutItem
    kind: str  # table, index, stream, queue, topic, bucket, workgroup, statemachine, *
    resource: str  # the template's logical id, or "?<name>" when the environment has none
    detail: str | None  # the index name, the object key
    attributes: tuple[str, ...] | None
    site: str  # the innermost frames in src/tally

    def line(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def parse(text: str) -> Call:
        data = json.loads(text)
        if data["attributes"] is not None:
            data["attributes"] = tuple(data["attributes"])
        return Call(**data)


@contextlib.contextmanager
def acting_as(function: str) -> Iterator[None]:
    """Attribute the calls made inside to ``function`` (a call its client is made to try)."""
    token = ACTING.set(function)
    try:
        yield
    finally:
        ACTING.reset(token)


class Recorder:
    """Records the calls of the functions ``handlers`` names (handler path -> logical id)."""

    def __init__(
        self, handlers: Mapping[str, str], environment: Mapping[str, str], out: Path | None = None
    ):
        self.handlers = dict(handlers)
        self.environment = dict(environment)  # variable -> logical id it names
        self.calls: list[Call] = []
        self.out = out
        self._submit: Callable[..., Any] | None = None
        self._session: Any = None

    def install(self) -> None:
        self._session = boto3._get_default_session()
        self._session.events.register("provide-client-params", self._hook, unique_id="iam-recorder")
        submit = concurrent.futures.ThreadPoolExecutor.submit
        self._submit = submit
        recorder = self

        def inherit(pool: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            function = recorder.current_function()
            if function is None:
                return submit(pool, fn, *args, **kwargs)

            def run() -> Any:
                with acting_as(function):
                    return fn(*args, **kwargs)

            return submit(pool, run)

        concurrent.futures.ThreadPoolExecutor.submit = inherit  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._session is not None:
            self._session.events.unregister("provide-client-params", unique_id="iam-recorder")
        if self._submit is not None:
            concurrent.futures.ThreadPoolExecutor.submit = self._submit  # type: ignore[method-assign]

    def current_function(self) -> str | None:
        acting = ACTING.get()
        if acting is not None:
            return acting
        for frame, _ in traceback.walk_stack(None):
            code = frame.f_code
            if code.co_name == "handler" and os.path.dirname(code.co_filename) == _HANDLERS:
                module = Path(code.co_filename).stem
                return self.handlers.get(f"tally.handlers.{module}.handler")
        return None

    def _hook(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        function = self.current_function()
        if function is None:
            return
        service = model.service_model.signing_name or model.service_model.endpoint_prefix
        site = _site()
        for kind, name, detail, action, attributes in _requests(service, model.name, params):
            call = Call(
                function,
                model.name,
                f"{service}:{action}",
                kind,
                self._logical(kind, name),
                detail,
                attributes,
                site,
            )
            self.calls.append(call)
            if self.out is not None:
                with self.out.open("a") as out:
                    out.write(call.line() + "\n")

    def _logical(self, kind: str, name: str) -> str:
        """The logical id whose physical name the function's environment gives for ``name``."""
        if kind == "*":
            return "*"
        for variable, logical in self.environment.items():
            value = os.environ.get(variable)
            if value and (value == name or value.rstrip("/").rsplit("/", 1)[-1] == name):
                return logical
        return f"?{name}"


def _site() -> str:
    """The innermost frames in src/tally: where the code made the call."""
    frames = [
        f"{os.path.relpath(f.filename, os.path.dirname(_TALLY))}:{f.lineno} {f.name}"
        for f in reversed(traceback.extract_stack())
        if f.filename.startswith(_TALLY + os.sep)
    ]
    return " < ".join(frames[:3]) or "(outside src/tally)"


Request = tuple[str, str, str | None, str, tuple[str, ...] | None]


def _requests(service: str, operation: str, params: Mapping[str, Any]) -> list[Request]:
    """(kind, name, detail, action, attributes) for each authorization the call needs."""
    if service == "dynamodb":
        return _dynamodb(operation, params)
    if service == "sqs" and "QueueUrl" in params:
        return [("queue", params["QueueUrl"], None, operation, None)]
    if service == "sns" and "TopicArn" in params:
        return [("topic", params["TopicArn"], None, operation, None)]
    if service == "ssm" and "Name" in params:
        return [("parameter", params["Name"], None, operation, None)]
    if service == "s3" and "Bucket" in params:
        return [("bucket", params["Bucket"], params.get("Key"), operation, None)]
    if service == "athena" and "WorkGroup" in params:
        return [("workgroup", params["WorkGroup"], None, operation, None)]
    if service == "states" and "stateMachineArn" in params:
        return [("statemachine", params["stateMachineArn"], None, operation, None)]
    return [("*", "*", None, operation, None)]


def _dynamodb(operation: str, params: Mapping[str, Any]) -> list[Request]:
    if "StreamArn" in params:
        table = params["StreamArn"].split("/stream/")[0].rsplit("/", 1)[-1]
        return [("stream", table, None, operation, None)]
    if operation in ("BatchGetItem", "BatchWriteItem"):
        found: list[Request] = []
        for table, body in params["RequestItems"].items():
            names: set[str] = set()
            for write in body if isinstance(body, list) else []:
                request = write.get("PutRequest") or write.get("DeleteRequest") or {}
                names |= set(request.get("Item") or request.get("Key") or {})
            if isinstance(body, dict):
                names |= _attributes(body)
                for key in body.get("Keys", []):
                    names |= set(key)
            found.append(("table", table, None, operation, tuple(sorted(names))))
        return found
    if operation in ("TransactWriteItems", "TransactGetItems"):
        found = []
        for entry in params["TransactItems"]:
            [(kind, body)] = entry.items()
            found.append(
                (
                    "table",
                    body["TableName"],
                    None,
                    _TRANSACT[kind],
                    tuple(sorted(_attributes(body))),
                )
            )
        return found
    if "TableName" not in params:
        return [("*", "*", None, operation, None)]
    attributes = tuple(sorted(_attributes(params))) if "Key" in params or "Item" in params else None
    if params.get("IndexName"):
        return [("index", params["TableName"], params["IndexName"], operation, attributes)]
    return [("table", params["TableName"], None, operation, attributes)]


def _attributes(body: Mapping[str, Any]) -> set[str]:
    """Top-level attribute names an item request names (for ``dynamodb:Attributes``)."""
    names = set(body.get("Item") or {}) | set(body.get("Key") or {})
    aliases = body.get("ExpressionAttributeNames") or {}
    for field in ("UpdateExpression", "ConditionExpression", "ProjectionExpression"):
        text = re.sub(r":\w+", " ", body.get(field) or "")
        for token in re.findall(r"#?[A-Za-z_][\w]*(?:[.\[][^\s,)=+-]*)?", text):
            top = re.split(r"[.\[]", token, maxsplit=1)[0]
            if top in _EXPRESSION_WORDS or top.upper() in _EXPRESSION_WORDS:
                continue
            names.add(aliases.get(top, top))
    return names


def environment_roles(template: Mapping[str, Any]) -> dict[str, str]:
    """Each function environment variable that names a resource, and that resource's id."""
    resources = set(template["Resources"])
    variables: dict[str, Any] = dict(template["Globals"]["Function"]["Environment"]["Variables"])
    for body in template["Resources"].values():
        if body["Type"] == "AWS::Serverless::Function":
            variables |= body.get("Properties", {}).get("Environment", {}).get("Variables", {})
    roles = {}
    for variable, value in variables.items():
        logical = _first_resource(value, resources)
        if logical is not None:
            roles[variable] = logical
    return roles


def _first_resource(node: Any, resources: set[str]) -> str | None:
    if isinstance(node, dict):
        if node.get("Ref") in resources:
            return str(node["Ref"])
        for value in node.values():
            found = _first_resource(value, resources)
            if found is not None:
                return found
    if isinstance(node, list):
        for value in node:
            found = _first_resource(value, resources)
            if found is not None:
                return found
    return None


def load(path: Path) -> list[Call]:
    return [Call.parse(line) for line in path.read_text().splitlines() if line.strip()]
