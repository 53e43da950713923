"""The full audit as SQL over a DynamoDB export, generated from the rules, for any engine.

One pass over the exported items classifies each item once (parent, child, sequence counter
or member of which rule), counts or sums children per parent, and describes members per
counter (highest, duplicates, missing ranges by gaps-and-islands over the numbers held,
never over every number), each number as its ordinal like the reconciler judges it (member n
of a counter that holds the next free number is the (n+1)-th). The query returns
*candidates*: parents and counters whose exported numbers disagree. An export is not a
snapshot of now, so each candidate still goes through the settled recount or the sequence
recheck before it can become a finding. The first half, the items and the role each plays,
is ``tally.audit.facts``.

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

from tally.audit.candidates import PROBLEMS
from tally.audit.facts import PLAIN_NUMBER, AuditFacts, literal
from tally.rules import SequenceRule, SumRule

# Amounts summed exactly: 20 + 9 digits, so a billion of them still fit DECIMAL(38, 9).
EXACT_AMOUNT = r"^-?[0-9]{1,20}(\.[0-9]{1,9})?$"


class AuditQuery(AuditFacts):
    """The audit query for some rules of one table, in Athena's SQL."""

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
        names = " ".join(f"WHEN {i} THEN {literal(r.name)}" for i, r in enumerate(self.rules))
        keys = ", ".join(f"p{i} AS key_{i}" for i in range(len(self._keys)))
        order = ", ".join(f"key_{i}" for i in range(len(self._keys)))
        return (
            "WITH " + ",\n".join(ctes) + "\n"
            f"SELECT CASE rid {names} END AS rule, {keys}, stored, actual, "
            + ", ".join(PROBLEMS)
            + f", first_missing FROM candidates ORDER BY rule, {order}"
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
            + f", a.counter AS stored, CAST({self._shown('a.highest')} AS VARCHAR) AS actual"
            ", CASE WHEN a.upto IS NULL THEN 1 ELSE 0 END AS invalid_counter"
            ", CASE WHEN a.odd > 0 THEN 1 ELSE 0 END AS inexact"
            ", CASE WHEN a.highest > a.upto THEN 1 ELSE 0 END AS counter_behind"
            ", a.duplicates, coalesce(b.missing, 0) AS missing"
            f", {self._shown('b.first_missing')} AS first_missing"
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

    def _shown(self, ordinal: str) -> str:
        """A number of the sequence row ``a`` judged as an ordinal (``facts.ordinal``),
        as the member's own: what a candidate shows."""
        next_free = [
            i
            for i, rule in enumerate(self.rules)
            if isinstance(rule, SequenceRule) and rule.counter_holds == "next"
        ]
        if not next_free:
            return ordinal
        return f"{ordinal} - CASE WHEN a.rid IN ({_ids(next_free)}) THEN 1 ELSE 0 END"

    def _pkeys(self) -> list[str]:
        return [f"p{i}" for i in range(len(self._keys))]

    def _join(self, left: str, right: str) -> str:
        columns = ["rid", *self._pkeys()]
        return " AND ".join(f"{left}.{c} = {right}.{c}" for c in columns)

    def _group_keys(self) -> str:
        return ", ".join(self._pkeys())


def _ids(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)
