"""What the emulator does to DynamoDB's JSON on the way in and out of a Region, as values.

Every write to a replicated table gets the hidden stamp (``HIDDEN_STAMP``, ``HIDDEN_ORIGIN``)
of the Region it was made in; every answer and every stream record leaves without it, so no
program (the reconciler included) can lean on a marker that AWS keeps private. A deletion has
nowhere to keep its stamp: its tombstone goes to a side table, in the same transaction when
the client sent one, else right after (the proxy holds the key meanwhile).

The wire format is DynamoDB's JSON protocol (``X-Amz-Target: DynamoDB_20120810.<Op>``), the
same for boto3, the AWS CLI and every other SDK.
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

HIDDEN_STAMP = "__gt_ts"
HIDDEN_ORIGIN = "__gt_origin"
HIDDEN = (HIDDEN_STAMP, HIDDEN_ORIGIN)
TOMBSTONES_SUFFIX = ".gt-tombstones"

# An item's key as the wire carries it, hashable: (name, type, value) sorted by name.
WireKey = tuple[tuple[str, str, Any], ...]


def tombstones_of(table: str) -> str:
    """The side table holding the stamps of a replicated table's deletions."""
    return f"{table}{TOMBSTONES_SUFFIX}"


def _canonical(kind: str, value: Any) -> Any:
    """One spelling per key value: a binary as base64 text (a client sends it so, boto3 reads
    it back as bytes), a number without its trailing zeros (DynamoDB holds 1.0 as 1)."""
    if kind == "B" and isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if kind == "N":
        try:
            number = Decimal(value)
        except (InvalidOperation, TypeError, ValueError):
            return value
        return str(number.normalize()) if number else "0"
    return value


def wire_key(attributes: Mapping[str, Mapping[str, Any]]) -> WireKey:
    """An item's key, hashable, the same however the key was spelled."""
    return tuple(
        sorted(
            (name, kind, _canonical(kind, value))
            for name, typed in attributes.items()
            for kind, value in typed.items()
        )
    )


def key_attributes(key: WireKey) -> dict[str, dict[str, Any]]:
    """The key as boto3 takes it (a binary as bytes)."""
    return {
        name: {kind: base64.b64decode(value) if kind == "B" else value} for name, kind, value in key
    }


@dataclass(frozen=True, order=True)
class WireStamp:
    """A hidden stamp: microseconds on the writing Region's clock, then its name (a tie)."""

    at: int
    origin: str

    def attributes(self) -> dict[str, dict[str, str]]:
        return {HIDDEN_STAMP: {"N": str(self.at)}, HIDDEN_ORIGIN: {"S": self.origin}}


def stamp_of(image: Mapping[str, Mapping[str, Any]]) -> WireStamp | None:
    """The hidden stamp an item or tombstone carries, None if it has none."""
    try:
        return WireStamp(int(image[HIDDEN_STAMP]["N"]), image[HIDDEN_ORIGIN]["S"])
    except (KeyError, TypeError, ValueError):
        return None


class Refused(ValueError):
    """A request the emulator answers with a DynamoDB error of its own."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Deletion:
    """A key a request deletes outside a transaction: its tombstone is written after it."""

    table: str
    key: WireKey


@dataclass(frozen=True)
class Stamped:
    """A request with the hidden stamp added, and the deletions it makes that need a
    tombstone written after they succeed."""

    body: dict[str, Any]
    deletions: tuple[Deletion, ...] = ()


_SET = re.compile(r"(?<![#:\w.])SET\b", re.IGNORECASE)
_NAMES = {"#__gt_ts": HIDDEN_STAMP, "#__gt_origin": HIDDEN_ORIGIN}


def _stamp_update(update: dict[str, Any], stamp: WireStamp) -> None:
    """Add ``SET`` of the hidden stamp to an UpdateItem (or a transaction's Update)."""
    values = {":__gt_ts": {"N": str(stamp.at)}, ":__gt_origin": {"S": stamp.origin}}
    if "AttributeUpdates" in update:  # the legacy form: no expressions allowed beside it
        update["AttributeUpdates"] = {
            **update["AttributeUpdates"],
            **{n: {"Action": "PUT", "Value": v} for n, v in stamp.attributes().items()},
        }
        return
    assignment = "#__gt_ts = :__gt_ts, #__gt_origin = :__gt_origin"
    expression = update.get("UpdateExpression", "")
    if _SET.search(expression):
        expression = _SET.sub(f"SET {assignment},", expression, count=1)
    else:
        expression = f"SET {assignment} {expression}".strip()
    update["UpdateExpression"] = expression
    update["ExpressionAttributeNames"] = {**update.get("ExpressionAttributeNames", {}), **_NAMES}
    update["ExpressionAttributeValues"] = {
        **update.get("ExpressionAttributeValues", {}),
        **values,
    }


def _tombstone_put(table: str, key: Mapping[str, Any], stamp: WireStamp) -> dict[str, Any]:
    return {"Put": {"TableName": tombstones_of(table), "Item": {**key, **stamp.attributes()}}}


_PARTIQL_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


def stamp_request(
    operation: str, body: Mapping[str, Any], stamp: WireStamp, replicated: Iterable[str]
) -> Stamped:
    """The request with every write to a replicated table stamped; raises ``Refused`` for a
    write the emulator cannot stamp (PartiQL)."""
    tables = set(replicated)
    out = copy.deepcopy(dict(body))
    if operation == "PutItem" and out.get("TableName") in tables:
        out["Item"] = {**out["Item"], **stamp.attributes()}
    elif operation == "UpdateItem" and out.get("TableName") in tables:
        _stamp_update(out, stamp)
    elif operation == "DeleteItem" and out.get("TableName") in tables:
        return Stamped(out, (Deletion(out["TableName"], wire_key(out["Key"])),))
    elif operation == "BatchWriteItem":
        deletions = []
        for table, requests in out.get("RequestItems", {}).items():
            if table not in tables:
                continue
            for request in requests:
                if "PutRequest" in request:
                    put = request["PutRequest"]
                    put["Item"] = {**put["Item"], **stamp.attributes()}
                elif "DeleteRequest" in request:
                    deletions.append(Deletion(table, wire_key(request["DeleteRequest"]["Key"])))
        return Stamped(out, tuple(deletions))
    elif operation == "TransactWriteItems":
        tombstones = []
        for action in out.get("TransactItems", []):
            [(kind, detail)] = action.items()
            if detail.get("TableName") not in tables:
                continue
            if kind == "Put":
                detail["Item"] = {**detail["Item"], **stamp.attributes()}
            elif kind == "Update":
                _stamp_update(detail, stamp)
            elif kind == "Delete":
                tombstones.append(_tombstone_put(detail["TableName"], detail["Key"], stamp))
        out["TransactItems"] = [*out.get("TransactItems", []), *tombstones]
    elif operation in ("ExecuteStatement", "BatchExecuteStatement", "ExecuteTransaction"):
        statements = (
            [out]
            if operation == "ExecuteStatement"
            else out.get("Statements") or out.get("TransactStatements", [])
        )
        for statement in statements:
            text = statement.get("Statement", "")
            if _PARTIQL_WRITE.match(text) and any(names_table(text, t) for t in tables):
                raise Refused(
                    "ValidationException",
                    "the multi-Region emulator replicates PutItem, UpdateItem, DeleteItem, "
                    "BatchWriteItem and TransactWriteItems; a PartiQL write to a replicated "
                    "table is refused",
                )
    return Stamped(out)


def names_table(statement: str, table: str) -> bool:
    """Whether a PartiQL statement names ``table`` (whole: ``t`` is not ``t-audit``)."""
    return re.search(rf"(?<![\w.-]){re.escape(table)}(?![\w.-])", statement) is not None


def transaction_touches(operation: str, body: Mapping[str, Any], tables: Iterable[str]) -> bool:
    """Whether a transaction (``TransactWriteItems``, ``TransactGetItems``, a PartiQL
    ``ExecuteTransaction``) names one of ``tables``."""
    names = set(tables)
    if operation == "ExecuteTransaction":
        statements = body.get("TransactStatements") or []
        return any(names_table(s.get("Statement", ""), t) for s in statements for t in names)
    return any(
        detail.get("TableName") in names
        for action in body.get("TransactItems") or []
        for detail in action.values()
    )


def without_hidden(value: Any) -> Any:
    """The value with the hidden stamp taken out of every item, key or image it holds."""
    if isinstance(value, dict):
        return {k: without_hidden(v) for k, v in value.items() if k not in HIDDEN}
    if isinstance(value, list):
        return [without_hidden(v) for v in value]
    return value


def visible_records(records: Iterable[Mapping[str, Any]], region: str) -> list[dict[str, Any]]:
    """Stream records as a reader in ``region`` sees them: no hidden stamp, and no record of a
    local write that changed nothing but the stamp (DynamoDB writes no record for a write that
    changes nothing). A replicated write is always shown, even one that brings the same
    values (inferred: the evidence a Region's own write was replaced)."""
    shown = []
    for record in records:
        images = record.get("dynamodb", {})
        new, old = images.get("NewImage"), images.get("OldImage")
        stamp = stamp_of(new) if new is not None else None
        local = stamp is not None and stamp.origin == region
        if (
            record.get("eventName") == "MODIFY"
            and local
            and without_hidden(new) == without_hidden(old)
        ):
            continue
        # A replica's records name the Region that reads them, whoever wrote (documented).
        shown.append({**without_hidden(record), "awsRegion": region})
    return shown


def hides_tables(names: Iterable[str]) -> list[str]:
    """ListTables' answer without the emulator's side tables."""
    return [n for n in names if not n.endswith(TOMBSTONES_SUFFIX)]
