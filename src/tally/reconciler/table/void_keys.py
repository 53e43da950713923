"""Where a VOID tombstone for a sequence's missing number is written."""

from __future__ import annotations

from tally.rules import IndexMembers, Key, SequenceRule, TableKeys

VOID = "void"  # the attribute that marks a tombstone


def void_key(rule: SequenceRule, counter_key: Key, number: int, table: TableKeys) -> Key:
    """The key a VOID tombstone for ``number`` is written at."""
    if not isinstance(rule.members, IndexMembers):
        return rule.member_key(counter_key, number, table)
    return index_void_key(rule, rule.members, number, table)


def index_void_key(rule: SequenceRule, members: IndexMembers, number: int, table: TableKeys) -> Key:
    """An index-layout tombstone's key for the ordinal ``number``: the member pattern with
    ``VOID`` and the member's own number in its free parts."""
    pattern, shown = members.key, rule.shown_number(number)
    key = {}
    for name in table.names:
        value = pattern.get(name)
        if value is None:
            key[name] = "VOID"
        elif value.endswith("*"):
            key[name] = f"{value[:-1]}VOID#{rule.name}#{shown:010d}"
        else:
            key[name] = value
    return key
