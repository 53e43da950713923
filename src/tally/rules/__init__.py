"""The rules: the declared counter invariants, loaded and validated once from one TOML file.

A rule is modelled in ``rule_base`` (what every rule declares), ``tally_rules`` (count and
sum), ``index_children`` (their ``through``) and ``sequence_rules``, on the table's keys of
``table_keys``; ``rule_set`` holds the whole file and classifies keys by the patterns of
``key_patterns``. What a rules file must not say is in ``validation``; ``loading`` reads the
file and runs both. The rest of the code imports rules from here; the modules of this
package import one another directly.
"""

from tally.rules.index_children import INDEX_GRACE_SECONDS, IndexChildren
from tally.rules.loading import (
    DEFAULT_RULES_FILE,
    RulesFileError,
    load_rules,
    parse_rules,
)
from tally.rules.rule_base import MAX_NAME_LENGTH, ORPHAN_GRACE_SECONDS, REPAIR_MARKER, RepairMode
from tally.rules.rule_set import AnyRule, Match, ParentOf, Role, Rule, RuleSet
from tally.rules.sequence_rules import (
    NO_COUNTER,
    AttributeMembers,
    CollectionMembers,
    CounterHolds,
    IndexMembers,
    Members,
    PartitionMembers,
    SequenceRule,
)
from tally.rules.table_keys import PK_SK, Key, KeyPattern, TableKeys
from tally.rules.tally_rules import SUM_DIGITS, CountRule, SumRule, TallyRule

__all__ = [
    "DEFAULT_RULES_FILE",
    "INDEX_GRACE_SECONDS",
    "MAX_NAME_LENGTH",
    "NO_COUNTER",
    "ORPHAN_GRACE_SECONDS",
    "PK_SK",
    "REPAIR_MARKER",
    "SUM_DIGITS",
    "AnyRule",
    "AttributeMembers",
    "CollectionMembers",
    "CountRule",
    "CounterHolds",
    "IndexChildren",
    "IndexMembers",
    "Key",
    "KeyPattern",
    "Match",
    "Members",
    "ParentOf",
    "PartitionMembers",
    "RepairMode",
    "Role",
    "Rule",
    "RuleSet",
    "RulesFileError",
    "SequenceRule",
    "SumRule",
    "TableKeys",
    "TallyRule",
    "load_rules",
    "parse_rules",
]
