"""The audit query's first half: the exported items, and the role each plays for each rule.

``items`` reads only the attributes the rules name out of the export's ``Item`` column;
``facts`` holds one row per item and role (parent or counter, child, sequence member, or
a child its rule's index cannot hold), with the parent's key and the item's value. The
judging half (``tally.audit.sql``) groups these rows per parent.

Children found through an index are found by the base table's attributes: an item keyed as
a child counts for the parent its index partition key names, if the index holds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tally.audit.columns import check_folds, check_supported, read_attributes
from tally.audit.unindexed import index_key_types
from tally.rules import (
    AnyRule,
    AttributeMembers,
    CollectionMembers,
    IndexMembers,
    SequenceRule,
    SumRule,
    TableKeys,
    TallyRule,
)
from tally.rules.key_patterns import Pattern

# Sequence numbers and counters the query reads as BIGINT (leading zeros of a padded key).
PLAIN_NUMBER = r"^0*[0-9]{1,18}$"
SIGNED_NUMBER = r"^-?0*[0-9]{1,18}$"


@dataclass(frozen=True)
class _Slot:
    """One role of one rule: the items that play it, their parent's key and their value."""

    rule: int
    role: str  # P: parent or counter, C: child, M: sequence member, U: child out of the index
    where: str
    parent: tuple[str, ...]
    value: str = "NULL"
    value_set: str = "FALSE"
    number: str = "NULL"
    odd: str = "0"


class AuditFacts:
    """The items of an export and their roles, for some rules of one table."""

    def __init__(self, rules: Sequence[AnyRule], table: TableKeys):
        if not rules:
            raise ValueError("the audit query needs at least one rule")
        check_supported(rules, table)
        self.rules = list(rules)
        self.table = table
        self.attributes = read_attributes(self.rules, table)
        check_folds(self.attributes)
        self._alias = {name: f"a{i}" for i, name in enumerate(self.attributes)}
        self._keys = [f"k{i}" for i in range(len(table.names))]

    # --- what the engine reads ------------------------------------------------------------

    def item_type(self) -> str:
        """The ``item`` column's Hive type: only the attributes the rules name, lower-cased
        as the JSON SerDe matches them."""
        fields = []
        for name, types in self.attributes.items():
            inner = ",".join(f"{t.lower()}:string" for t in sorted(types))
            fields.append(f"{name.lower()}:struct<{inner}>")
        return f"struct<{','.join(fields)}>"

    def duckdb_item_type(self) -> str:
        """The same type for DuckDB's JSON reader, which matches keys as written (the query's
        field access is case-insensitive in DuckDB, as the SerDe's is)."""
        fields = []
        for name, types in self.attributes.items():
            inner = ", ".join(f"{_quote(t)} VARCHAR" for t in sorted(types))
            fields.append(f"{_quote(name)} STRUCT({inner})")
        return f"STRUCT({', '.join(fields)})"

    def athena_table(self, database: str, table: str, location: str) -> str:
        """DDL for the export's data files as an Athena table (OpenX JSON SerDe)."""
        return (
            f"CREATE EXTERNAL TABLE IF NOT EXISTS `{database}`.`{table}` (item {self.item_type()})"
            f" ROW FORMAT SERDE 'org.openx.data.jsonserde.JsonSerDe' LOCATION {literal(location)}"
        )

    def athena_drop(self, database: str, table: str) -> str:
        """DDL dropping the table ``athena_table`` made (the data files stay)."""
        return f"DROP TABLE IF EXISTS `{database}`.`{table}`"

    # --- the items and their roles -----------------------------------------------------

    def _items(self, source: str) -> str:
        item = self._name("Item")
        columns = [
            f"{item}.{self._name(name)}.{self._name('S')} AS {alias}"
            for name, alias in zip(self.table.names, self._keys, strict=True)
        ]
        for name, types in self.attributes.items():
            alias, field = self._alias[name], f"{item}.{self._name(name)}"
            if "S" in types and name not in self.table.names:
                columns.append(f"{field}.{self._name('S')} AS {alias}_s")
            if "N" in types:
                columns.append(f"{field}.{self._name('N')} AS {alias}_n")
                columns.append(f"{field} IS NOT NULL AS {alias}_set")
            if "B" in types:
                columns.append(f"{field}.{self._name('B')} AS {alias}_b")
        return f"SELECT {', '.join(columns)} FROM {source}"

    def _slots(self) -> list[_Slot]:
        slots: list[_Slot] = []
        keys = self.table
        for index, rule in enumerate(self.rules):
            counter = self._alias[rule.counter]
            slots.append(
                _Slot(
                    index,
                    "P",
                    self._matches(rule.parent_pattern(keys)),
                    tuple(f"i.{k}" for k in self._keys),
                    f"i.{counter}_n",
                    f"i.{counter}_set",
                )
            )
            if isinstance(rule, TallyRule):
                value, value_set = "NULL", "FALSE"
                if isinstance(rule, SumRule):
                    summed = self._alias[rule.summed]
                    value, value_set = f"i.{summed}_n", f"i.{summed}_set"
                child = self._matches(rule.child_pattern(keys))
                if rule.through is not None:
                    slots.extend(self._indexed_slots(index, rule, child, value, value_set))
                    continue
                slots.append(_Slot(index, "C", child, self._parent_of(rule), value, value_set))
            elif isinstance(rule.members, CollectionMembers):
                assert keys.sort_key is not None
                sort_key = self._keys[keys.names.index(keys.sort_key)]
                digits = f"substr(i.{sort_key}, {len(rule.members.prefix) + 1})"
                where = self._matches(rule.member_pattern(keys))
                number, odd = self._number(digits, PLAIN_NUMBER, r"^[0-9]+$")
                number = ordinal(rule, number)
                slots.append(
                    _Slot(index, "M", where, self._parent_of(rule), number=number, odd=odd)
                )
            elif isinstance(rule.members, AttributeMembers):
                continue  # members are in the reconciler's ledger; the counter is a candidate
            else:
                members = rule.members
                assert isinstance(members, IndexMembers)
                name = self._alias[members.sequence_attribute]
                value = f"i.{self._alias[members.number]}_n"
                where = f"i.{name}_s = {literal(rule.sequence_name)} AND {value} IS NOT NULL"
                number, odd = self._number(value, SIGNED_NUMBER, r"^-?[0-9]+$")
                number = ordinal(rule, number)
                slots.append(
                    _Slot(index, "M", where, self._parent_of(rule), number=number, odd=odd)
                )
        return slots

    def _indexed_slots(
        self, index: int, rule: TallyRule, child: str, value: str, value_set: str
    ) -> list[_Slot]:
        """Children found through an index, by the base table's attributes: an item keyed as
        a child (and not as the parent) counts for the parent its index partition key names,
        if the index holds it (both index keys present, non-empty, of the index key's type)
        and its index sort key has the status prefix; one the index cannot hold is a ``U``."""
        keys, through = self.table, rule.through
        assert through is not None
        child = f"{child} AND NOT ({self._matches(rule.parent_pattern(keys))})"
        holds = [self._holds(name, types) for name, types in index_key_types(rule, keys).items()]
        visible = " AND ".join(holds)
        named = self._text(through.partition_key)
        counted = [
            child,
            visible,
            self._match(named, rule.parent_pattern(keys)[keys.partition_key]),
        ]
        if through.sort_prefix is not None:
            assert through.sort_key is not None
            status = Pattern(through.sort_prefix, True)
            counted.append(self._match(self._text(through.sort_key), status))
        parent = tuple(
            named if name == keys.partition_key else literal(rule.parent[name])
            for name in keys.names
        )
        own = tuple(f"i.{k}" for k in self._keys)
        return [
            _Slot(index, "C", " AND ".join(counted), parent, value, value_set),
            _Slot(index, "U", f"{child} AND NOT ({visible})", own),
        ]

    def _holds(self, name: str, types: frozenset[str]) -> str:
        """TRUE when the item's ``name`` is an index key value of one of ``types`` (never
        NULL): present, and not an empty string or binary."""
        if name in self.table.names:
            return "TRUE"  # a table key: always there, a non-empty string
        alias = self._alias[name]
        held = []
        if "S" in types:
            held.append(f"coalesce(i.{alias}_s <> '', FALSE)")
        if "N" in types:
            held.append(f"i.{alias}_n IS NOT NULL")
        if "B" in types:
            held.append(f"coalesce(i.{alias}_b <> '', FALSE)")
        return "(" + " OR ".join(held) + ")"

    def _text(self, name: str) -> str:
        """The column of a string attribute: a key column, or the attribute's S value."""
        if name in self.table.names:
            return f"i.{self._keys[self.table.names.index(name)]}"
        return f"i.{self._alias[name]}_s"

    def _facts(self, slots: list[_Slot]) -> str:
        def pick(values: list[str]) -> str:
            whens = " ".join(f"WHEN {n} THEN {v}" for n, v in enumerate(values))
            return f"CASE s.slot {whens} END"

        rows = ", ".join(f"({n}, {s.rule}, '{s.role}')" for n, s in enumerate(slots))
        columns = [
            "s.rid",
            "s.role",
            *(f"{pick([s.parent[k] for s in slots])} AS p{k}" for k in range(len(self._keys))),
            f"{pick([s.value for s in slots])} AS val",
            f"{pick([s.value_set for s in slots])} AS val_set",
            f"{pick([s.number for s in slots])} AS num",
            f"{pick([s.odd for s in slots])} AS odd",
        ]
        where = " OR ".join(f"(s.slot = {n} AND {s.where})" for n, s in enumerate(slots))
        return (
            f"SELECT {', '.join(columns)} FROM items i "
            f"CROSS JOIN (VALUES {rows}) AS s(slot, rid, role) WHERE {where}"
        )

    # --- helpers ------------------------------------------------------------------------

    def _parent_of(self, rule: AnyRule) -> tuple[str, ...]:
        """Per key attribute: the item's own value, or the parent's fixed one."""
        if isinstance(rule, SequenceRule) and isinstance(
            rule.members, IndexMembers | AttributeMembers
        ):
            return tuple(literal(rule.parent[name]) for name in self.table.names)
        sort_key = self.table.sort_key
        return tuple(
            literal(rule.parent[name]) if name == sort_key else f"i.{alias}"
            for name, alias in zip(self.table.names, self._keys, strict=True)
        )

    def _matches(self, pattern: Mapping[str, Pattern]) -> str:
        return " AND ".join(
            self._match(f"i.{self._keys[self.table.names.index(name)]}", p)
            for name, p in pattern.items()
        )

    def _match(self, column: str, p: Pattern) -> str:
        if not p.is_prefix:
            return f"{column} = {literal(p.value)}"
        if p.value:
            return f"substr({column}, 1, {len(p.value)}) = {literal(p.value)}"
        return f"{column} IS NOT NULL"

    def _number(self, text: str, readable: str, numeric: str) -> tuple[str, str]:
        """A member's number as BIGINT (or NULL), and 1 when it is a number too long to read."""
        number = f"CASE WHEN {self._re(text, readable)} THEN TRY_CAST({text} AS BIGINT) END"
        odd = (
            f"CASE WHEN {self._re(text, numeric)} AND NOT {self._re(text, readable)} "
            "THEN 1 ELSE 0 END"
        )
        return number, odd

    def _re(self, text: str, pattern: str) -> str:
        return f"coalesce(regexp_like({text}, {literal(pattern)}), FALSE)"

    def _name(self, name: str) -> str:
        return name.lower()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def ordinal(rule: SequenceRule, number: str) -> str:
    """A member's number as its ordinal, as the reconciler judges it: member n of a counter
    that holds the next free number is the (n+1)-th (``SequenceRule.ordinal``)."""
    return f"({number}) + 1" if rule.counter_holds == "next" else number


def literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
