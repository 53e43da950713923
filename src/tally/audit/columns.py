"""What the export audit query can read: the rules it supports and the attributes it reads
as columns, with their DynamoDB types."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tally.audit.unindexed import index_key_types
from tally.rules import (
    AnyRule,
    IndexMembers,
    PartitionMembers,
    SequenceRule,
    SumRule,
    TableKeys,
    TallyRule,
)

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_supported(rules: Sequence[AnyRule], table: TableKeys) -> None:
    """The query reads string keys and collection or index members; the scan engine does
    the rest."""
    numeric = [name for name in table.names if table.numeric(name)]
    if numeric:
        raise ValueError(
            f"the export engine reads string keys only; {numeric[0]!r} is a number key: "
            "audit with the scan engine"
        )
    for rule in rules:
        if isinstance(rule, SequenceRule) and isinstance(rule.members, PartitionMembers):
            raise ValueError(
                f"rule {rule.name!r}: the export engine cannot read partition-layout members; "
                "audit with the scan engine"
            )


def read_attributes(rules: list[AnyRule], table: TableKeys) -> dict[str, set[str]]:
    """Every attribute the query reads, with the DynamoDB types (S, N) it reads it as."""
    wanted: dict[str, set[str]] = {name: {"S"} for name in table.names}

    def want(name: str, kind: str) -> None:
        wanted.setdefault(name, set()).add(kind)

    for rule in rules:
        want(rule.counter, "N")
        if isinstance(rule, SumRule):
            want(rule.summed, "N")
        if isinstance(rule, SequenceRule) and isinstance(rule.members, IndexMembers):
            want(rule.members.sequence_attribute, "S")
            want(rule.members.number, "N")
        if isinstance(rule, TallyRule) and rule.through is not None:
            for name, types in index_key_types(rule, table).items():
                if name not in table.names:  # a table key is always there, a string
                    for kind in sorted(types):
                        want(name, kind)
    return wanted


def check_folds(attributes: Mapping[str, set[str]]) -> None:
    """Athena's JSON SerDe reads attributes case-insensitively, by plain names only."""
    folded: dict[str, str] = {}
    for name in attributes:
        if not _IDENTIFIER.match(name):
            raise ValueError(
                f"attribute {name!r} cannot be a column for Athena's JSON SerDe: "
                "use letters, digits and underscores, or audit with the scan engine"
            )
        other = folded.setdefault(name.lower(), name)
        if other != name:
            raise ValueError(
                f"attributes {other!r} and {name!r} differ only in case: "
                "Athena's JSON SerDe cannot tell them apart"
            )
