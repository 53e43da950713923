"""The rules: the declared counter invariants, loaded and validated once from one TOML file.

What a rule is lives in ``model``, what a rules file must not say in ``validation``, how keys
are classified in ``key_patterns``; ``loading`` reads the file and runs both. The rest of the
code imports rules from here; the modules of this package import one another directly.
"""

from tally.rules.loading import (
    DEFAULT_RULES_FILE,
    RulesFileError,
    load_rules,
    parse_rules,
)
from tally.rules.model import (
    MAX_NAME_LENGTH,
    NO_COUNTER,
    ORPHAN_GRACE_SECONDS,
    PK_SK,
    REPAIR_MARKER,
    SUM_DIGITS,
    AnyRule,
    AttributeMembers,
    CollectionMembers,
    CounterHolds,
    CountRule,
    IndexMembers,
    Key,
    KeyPattern,
    Match,
    Members,
    ParentOf,
    PartitionMembers,
    RepairMode,
    Role,
    Rule,
    RuleSet,
    SequenceRule,
    SumRule,
    TableKeys,
)

__all__ = [
    "DEFAULT_RULES_FILE",
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
    "load_rules",
    "parse_rules",
]
