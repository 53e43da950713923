"""The full audit as SQL over a DynamoDB export, generated from the rules, for any engine.

One pass over the exported items classifies each item once (parent, child, sequence counter
or member of which rule), counts or sums children per parent, and describes members per
counter (highest, duplicates, missing ranges by gaps-and-islands over the numbers held,
never over every number). The query returns *candidates*: parents and counters whose
exported numbers disagree. An export is not a snapshot of now, so each candidate still goes
through the settled recount or the sequence recheck before it can become a finding.

Numbers stay exact: children are summed as DECIMAL(38, 9), and only amounts that fit it
exactly (at most 20 integer and 9 fractional digits) are summed. DynamoDB's numbers reach
38 digits anywhere from 1E-130 to 1E+126, which no DECIMAL(38, s) holds, so a parent with
any other number, a child amount that is not a number, or a counter the query cannot read
exactly, is a candidate whatever its sum: the recount sums it exactly (``tally.core.numbers``),
and no rounding can hide drift or make it up.

The query is written once, in Athena's SQL, over the table its own DDL declares (Hive's
DDL, the export's files through the OpenX JSON SerDe). ``check`` holds the statements to
that DDL before anything runs them: every column and struct field resolves, and every
function is one sqlglot knows for Athena. DuckDB (locally, over the export's files) runs
that same text transpiled by sqlglot (``to_duckdb``), Trino's NULL semantics included.
Both live in ``tally.local.athena_sql``: sqlglot is the local engine's, not the Lambdas'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tally.reconciler.audit_columns import check_folds, check_supported, read_attributes
from tally.reconciler.candidates import PROBLEMS
from tally.reconciler.unindexed import index_key_types
from tally.rules import (
    AnyRule,
    AttributeMembers,
    CollectionMembers,
    CountRule,
    IndexMembers,
    SequenceRule,
    SumRule,
    TableKeys,
)
from tally.rules.key_patterns import Pattern

# Amounts summed exactly: 20 + 9 digits, so a billion of them still fit DECIMAL(38, 9).
EXACT_AMOUNT = r"^-?[0-9]{1,20}(\.[0-9]{1,9})?$"
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


class AuditQuery:
    """The audit query for some rules of one table, in Athena's SQL."""

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
            f" ROW FORMAT SERDE 'org.openx.data.jsonserde.JsonSerDe' LOCATION {_lit(location)}"
        )

    def athena_drop(self, database: str, table: str) -> str:
        """DDL dropping the table ``athena_table`` made (the data files stay)."""
        return f"DROP TABLE IF EXISTS `{database}`.`{table}`"

    def sql(self, source: str) -> str:
        """The query over ``source``, the table ``athena_table`` declares."""
        slots = self._slots()
        tally_rules = [i for i, r in enumerate(self.rules) if not isinstance(r, SequenceRule)]
        sequence_rules = [i for i, r in enumerate(self.rules) if isinstance(r, SequenceRule)]
        parts = []
        if tally_rules:
            parts.append(self._tally_candidates(tally_rules))
        if any(s.role == "U" for s in slots):
            parts.append(self._unindexed_candidates())
        if sequence_rules:
            parts.append(self._sequence_candidates(sequence_rules))
        ctes = [
            f"items AS ({self._items(source)})",
            f"facts AS ({self._facts(slots)})",
            *self._tally_ctes(tally_rules),
            *self._sequence_ctes(sequence_rules),
            "candidates AS (" + " UNION ALL ".join(parts) + ")",
        ]
        names = " ".join(f"WHEN {i} THEN {_lit(r.name)}" for i, r in enumerate(self.rules))
        keys = ", ".join(f"p{i} AS key_{i}" for i in range(len(self._keys)))
        order = ", ".join(f"key_{i}" for i in range(len(self._keys)))
        return (
            "WITH " + ",\n".join(ctes) + "\n"
            f"SELECT CASE rid {names} END AS rule, {keys}, stored, actual, "
            + ", ".join(PROBLEMS)
            + f", first_missing FROM candidates ORDER BY rule, {order}"
        )

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
            if isinstance(rule, CountRule | SumRule):
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
                where = f"i.{name}_s = {_lit(rule.sequence_name)} AND {value} IS NOT NULL"
                number, odd = self._number(value, SIGNED_NUMBER, r"^-?[0-9]+$")
                slots.append(
                    _Slot(index, "M", where, self._parent_of(rule), number=number, odd=odd)
                )
        return slots

    def _indexed_slots(
        self, index: int, rule: CountRule | SumRule, child: str, value: str, value_set: str
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
            named if name == keys.partition_key else _lit(rule.parent[name]) for name in keys.names
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

    # --- count and sum rules --------------------------------------------------------------

    def _tally_ctes(self, rids: list[int]) -> list[str]:
        if not rids:
            return []
        exact = self._re("val", EXACT_AMOUNT)
        sums = [i for i in rids if isinstance(self.rules[i], SumRule)]
        truth = (
            f"CASE WHEN rid IN ({_ids(sums)}) THEN amount ELSE CAST(children AS DECIMAL(38, 9)) END"
            if sums
            else "CAST(children AS DECIMAL(38, 9))"
        )
        counter_exact = self._re("counter", EXACT_AMOUNT)
        return [
            "tallies AS (SELECT rid, "
            + self._group_keys()
            + ", max(CASE WHEN role = 'P' THEN 1 ELSE 0 END) AS parents"
            ", max(CASE WHEN role = 'P' THEN val END) AS counter"
            ", max(CASE WHEN role = 'P' AND val_set THEN 1 ELSE 0 END) AS counter_set"
            ", sum(CASE WHEN role = 'C' THEN 1 ELSE 0 END) AS children"
            f", sum(CASE WHEN role = 'C' AND {exact} THEN TRY_CAST(val AS DECIMAL(38, 9))"
            " ELSE 0 END) AS amount"
            # A child amount of another type (val NULL, val_set): the recount names it.
            f", sum(CASE WHEN role = 'C' AND val_set AND NOT {exact} THEN 1 ELSE 0 END)"
            " AS inexact_children"
            f" FROM facts WHERE rid IN ({_ids(rids)}) AND role IN ('P', 'C')"
            f" GROUP BY rid, {self._group_keys()})",
            "judged_tallies AS (SELECT rid, "
            + self._group_keys()
            + ", counter, CAST(truth AS VARCHAR) AS actual"
            ", CASE WHEN parents = 0 THEN 1 ELSE 0 END AS orphans"
            ", CASE WHEN parents = 1 AND counter_set = 1 AND counter IS NULL THEN 1 ELSE 0 END"
            " AS invalid_counter"
            f", CASE WHEN (counter IS NOT NULL AND NOT {counter_exact}) OR inexact_children > 0"
            " THEN 1 ELSE 0 END AS inexact"
            ", CASE WHEN parents = 1"
            f" AND ((counter IS NULL AND counter_set = 0) OR {counter_exact})"
            " AND coalesce(TRY_CAST(counter AS DECIMAL(38, 9)), 0) <> truth THEN 1 ELSE 0 END"
            " AS drift"
            f" FROM (SELECT *, {truth} AS truth FROM tallies) t)",
        ]

    def _tally_candidates(self, rids: list[int]) -> str:
        return (
            f"SELECT rid, {self._group_keys()}, counter AS stored, actual, drift, orphans, "
            "invalid_counter, inexact, 0 AS counter_behind, 0 AS duplicates, 0 AS missing, "
            "CAST(NULL AS BIGINT) AS first_missing, 0 AS unindexed FROM judged_tallies "
            "WHERE drift + orphans + invalid_counter + inexact > 0"
        )

    def _unindexed_candidates(self) -> str:
        """One row per item keyed as a child that its rule's index cannot hold: by its key."""
        return (
            f"SELECT rid, {self._group_keys()}, CAST(NULL AS VARCHAR) AS stored, "
            "CAST(NULL AS VARCHAR) AS actual, 0 AS drift, 0 AS orphans, 0 AS invalid_counter, "
            "0 AS inexact, 0 AS counter_behind, 0 AS duplicates, 0 AS missing, "
            "CAST(NULL AS BIGINT) AS first_missing, 1 AS unindexed FROM facts WHERE role = 'U'"
        )

    # --- sequences -----------------------------------------------------------------------

    def _sequence_ctes(self, rids: list[int]) -> list[str]:
        if not rids:
            return []
        keys = self._group_keys()
        both = ", ".join(f"coalesce(c.{k}, m.{k}) AS {k}" for k in self._pkeys())
        plain = self._re("c.counter", PLAIN_NUMBER)
        return [
            "counters AS (SELECT rid, "
            + keys
            + ", max(val) AS counter, max(CASE WHEN val_set THEN 1 ELSE 0 END) AS counter_set"
            f" FROM facts WHERE role = 'P' AND rid IN ({_ids(rids)}) GROUP BY rid, {keys})",
            # One row per number held (and one for the members without a readable number).
            f"numbers AS (SELECT rid, {keys}, num, count(*) AS held, sum(odd) AS odd"
            f" FROM facts WHERE role = 'M' GROUP BY rid, {keys}, num)",
            f"member_stats AS (SELECT rid, {keys}, max(num) AS highest"
            ", sum(CASE WHEN num IS NOT NULL AND held > 1 THEN 1 ELSE 0 END) AS duplicates"
            f", sum(odd) AS odd FROM numbers GROUP BY rid, {keys})",
            "sequences AS (SELECT coalesce(c.rid, m.rid) AS rid, "
            + both
            + ", c.counter, m.highest, coalesce(m.duplicates, 0) AS duplicates"
            ", coalesce(m.odd, 0) AS odd"
            f", CASE WHEN {plain} THEN TRY_CAST(c.counter AS BIGINT)"
            " WHEN coalesce(c.counter_set, 0) = 0 THEN 0 END AS upto"
            " FROM counters c FULL OUTER JOIN member_stats m ON " + self._join("c", "m") + ")",
            # Gaps and islands: the holes between consecutive numbers held, up to the counter.
            f"islands AS (SELECT rid, {keys}, num, lag(num) OVER "
            f"(PARTITION BY rid, {keys} ORDER BY num) AS prev FROM numbers WHERE num IS NOT NULL)",
            "gaps AS (SELECT a.rid, "
            + ", ".join(f"a.{k}" for k in self._pkeys())
            + ", greatest(coalesce(a.prev, 0) + 1, 1) AS lo, least(a.num - 1, b.upto) AS hi"
            " FROM islands a JOIN sequences b ON "
            + self._join("a", "b")
            + " WHERE b.upto IS NOT NULL"
            f" UNION ALL SELECT rid, {keys}, greatest(coalesce(highest, 0) + 1, 1) AS lo,"
            " upto AS hi FROM sequences WHERE upto IS NOT NULL)",
            f"gap_stats AS (SELECT rid, {keys}, sum(hi - lo + 1) AS missing,"
            f" min(lo) AS first_missing FROM gaps WHERE lo <= hi GROUP BY rid, {keys})",
            "judged_sequences AS (SELECT a.rid, "
            + ", ".join(f"a.{k}" for k in self._pkeys())
            + ", a.counter AS stored, CAST(a.highest AS VARCHAR) AS actual"
            ", CASE WHEN a.upto IS NULL THEN 1 ELSE 0 END AS invalid_counter"
            ", CASE WHEN a.odd > 0 THEN 1 ELSE 0 END AS inexact"
            ", CASE WHEN a.highest > a.upto THEN 1 ELSE 0 END AS counter_behind"
            ", a.duplicates, coalesce(b.missing, 0) AS missing, b.first_missing"
            " FROM sequences a LEFT JOIN gap_stats b ON " + self._join("a", "b") + ")",
        ]

    def _sequence_candidates(self, rids: list[int]) -> str:
        return (
            f"SELECT rid, {self._group_keys()}, stored, actual, 0 AS drift, 0 AS orphans, "
            "invalid_counter, inexact, counter_behind, duplicates, missing, first_missing, "
            "0 AS unindexed FROM judged_sequences "
            "WHERE invalid_counter + inexact + counter_behind + duplicates + missing > 0"
        )

    # --- helpers ------------------------------------------------------------------------

    def _pkeys(self) -> list[str]:
        return [f"p{i}" for i in range(len(self._keys))]

    def _join(self, left: str, right: str) -> str:
        columns = ["rid", *self._pkeys()]
        return " AND ".join(f"{left}.{c} = {right}.{c}" for c in columns)

    def _group_keys(self) -> str:
        return ", ".join(self._pkeys())

    def _parent_of(self, rule: AnyRule) -> tuple[str, ...]:
        """Per key attribute: the item's own value, or the parent's fixed one."""
        if isinstance(rule, SequenceRule) and isinstance(
            rule.members, IndexMembers | AttributeMembers
        ):
            return tuple(_lit(rule.parent[name]) for name in self.table.names)
        sort_key = self.table.sort_key
        return tuple(
            _lit(rule.parent[name]) if name == sort_key else f"i.{alias}"
            for name, alias in zip(self.table.names, self._keys, strict=True)
        )

    def _matches(self, pattern: Mapping[str, Pattern]) -> str:
        return " AND ".join(
            self._match(f"i.{self._keys[self.table.names.index(name)]}", p)
            for name, p in pattern.items()
        )

    def _match(self, column: str, p: Pattern) -> str:
        if not p.is_prefix:
            return f"{column} = {_lit(p.value)}"
        if p.value:
            return f"substr({column}, 1, {len(p.value)}) = {_lit(p.value)}"
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
        return f"coalesce(regexp_like({text}, {_lit(pattern)}), FALSE)"

    def _name(self, name: str) -> str:
        return name.lower()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ids(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)
