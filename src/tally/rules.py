"""Rules: the declared counter invariants, loaded and validated once from one TOML file.

A key pattern maps a key attribute to a value: an exact string, or a prefix ending in ``*``.
Children of a count or sum rule share their parent's partition key; collection members of
a sequence share their counter's partition key; index members are found through a GSI.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

Key = dict[str, str]
RepairMode = Literal["auto", "alert", "off"]
Role = Literal["parent", "child", "member"]

DEFAULT_RULES_FILE = Path(__file__).resolve().parent.parent / "rules.toml"
# Set by every reconciler write on the counted table; no writer may set it (docs/verification.md).
REPAIR_MARKER = "tallyRepair"


class RulesFileError(ValueError):
    """The rules file is unreadable or breaks a rule; the message names the rule and field."""


@dataclass(frozen=True)
class Pattern:
    """One key attribute's pattern: an exact value, or a prefix when ``is_prefix``."""

    value: str
    is_prefix: bool

    @classmethod
    def parse(cls, text: str) -> Pattern:
        if "*" in text[:-1]:
            raise ValueError(f"{text!r} can never match: '*' may only end a pattern")
        if text.endswith("*"):
            return cls(text[:-1], True)
        if not text:
            raise ValueError("an empty key value can never match: DynamoDB keys are non-empty")
        return cls(text, False)

    def matches(self, value: str) -> bool:
        return value.startswith(self.value) if self.is_prefix else value == self.value

    def overlaps(self, other: Pattern) -> bool:
        if self.is_prefix and other.is_prefix:
            return self.value.startswith(other.value) or other.value.startswith(self.value)
        if self.is_prefix:
            return other.value.startswith(self.value)
        if other.is_prefix:
            return self.value.startswith(other.value)
        return self.value == other.value

    def __str__(self) -> str:
        return self.value + "*" if self.is_prefix else self.value


KeyPattern = dict[str, Pattern]


def _overlap(a: KeyPattern, b: KeyPattern) -> bool:
    """True when some key matches both (an attribute one side leaves open matches anything)."""
    return all(a[name].overlaps(b[name]) for name in a.keys() & b.keys())


_Checks = tuple[tuple[str, str, bool], ...]


def _checks(pattern: KeyPattern) -> _Checks:
    return tuple((name, p.value, p.is_prefix) for name, p in pattern.items())


def _checks_pass(checks: _Checks, key: Mapping[str, Any]) -> bool:
    for name, value, is_prefix in checks:
        actual = key.get(name)
        if actual.__class__ is not str:
            return False
        if not (actual.startswith(value) if is_prefix else actual == value):
            return False
    return True


def _parse_patterns(raw: Mapping[str, str]) -> KeyPattern:
    return {name: Pattern.parse(text) for name, text in raw.items()}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TableKeys(_Strict):
    partition_key: str = "PK"
    sort_key: str | None = "SK"
    # The table's TTL attribute, if it has one: writers keep it off items an expiry would break.
    ttl_attribute: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return (
            (self.partition_key,)
            if self.sort_key is None
            else (
                self.partition_key,
                self.sort_key,
            )
        )


class _RuleBase(_Strict):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    parent: dict[str, str]
    counter: Annotated[str, Field(min_length=1)]
    revision: str | None = None
    repair: RepairMode = "alert"

    @field_validator("parent")
    @classmethod
    def _parent_patterns_parse(cls, value: dict[str, str]) -> dict[str, str]:
        _parse_patterns(value)
        return value

    @property
    def parent_pattern(self) -> KeyPattern:
        return _parse_patterns(self.parent)


class _TallyRule(_RuleBase):
    children: dict[str, str]
    # "decrement": a child removed by TTL is a legitimate decrement the reconciler applies.
    on_ttl_expiry: Literal["alert", "decrement"] = "alert"

    @field_validator("children")
    @classmethod
    def _children_patterns_parse(cls, value: dict[str, str]) -> dict[str, str]:
        _parse_patterns(value)
        return value

    def child_pattern(self, keys: TableKeys) -> KeyPattern:
        """Children share the parent's partition key pattern and narrow the sort key."""
        pattern = {keys.partition_key: self.parent_pattern[keys.partition_key]}
        pattern.update(_parse_patterns(self.children))
        return pattern

    def parent_key_of(self, child_key: Mapping[str, str], keys: TableKeys) -> Key:
        assert keys.sort_key is not None
        return {
            keys.partition_key: child_key[keys.partition_key],
            keys.sort_key: self.parent[keys.sort_key],
        }

    def child_prefix(self, keys: TableKeys) -> str:
        assert keys.sort_key is not None
        return _parse_patterns(self.children)[keys.sort_key].value


class CountRule(_TallyRule):
    """The parent's counter equals the number of its children."""

    kind: Literal["count"]


class SumRule(_TallyRule):
    """The parent's counter equals the sum of ``summed`` over its children."""

    kind: Literal["sum"]
    summed: Annotated[str, Field(min_length=1)]


class CollectionMembers(_Strict):
    """Members in the counter's item collection: sort key = prefix + zero-padded number."""

    layout: Literal["collection"]
    SK: str
    width: Annotated[int, Field(ge=1, le=38)] = 10

    @field_validator("SK")
    @classmethod
    def _sk_is_prefix(cls, value: str) -> str:
        if not Pattern.parse(value).is_prefix:
            raise ValueError(f"{value!r} must be a prefix ending in '*' (the number follows it)")
        return value

    @property
    def prefix(self) -> str:
        return self.SK[:-1]


class IndexMembers(_Strict):
    """Members keyed by a natural key, found through a sparse GSI (sequence, number)."""

    layout: Literal["index"]
    key: dict[str, str]
    index: Annotated[str, Field(min_length=1)]
    sequence_attribute: Annotated[str, Field(min_length=1)]
    number: Annotated[str, Field(min_length=1)]
    sequence: str | None = None

    @field_validator("key")
    @classmethod
    def _key_patterns_parse(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise ValueError("a member key pattern needs at least one key attribute")
        _parse_patterns(value)
        return value


class SequenceRule(_RuleBase):
    """The counter equals the highest number handed out; 1..counter each present once."""

    kind: Literal["sequence"]
    members: Annotated[CollectionMembers | IndexMembers, Field(discriminator="layout")]
    grace_seconds: Annotated[int, Field(ge=0, le=900)] = 60

    @property
    def sequence_name(self) -> str:
        """The GSI partition value naming this sequence (index layout)."""
        assert isinstance(self.members, IndexMembers)
        return self.members.sequence or self.name

    def member_pattern(self, keys: TableKeys) -> KeyPattern:
        if isinstance(self.members, IndexMembers):
            return _parse_patterns(self.members.key)
        assert keys.sort_key is not None
        return {
            keys.partition_key: self.parent_pattern[keys.partition_key],
            keys.sort_key: Pattern(self.members.prefix, True),
        }

    def member_key(self, counter_key: Mapping[str, str], number: int, keys: TableKeys) -> Key:
        """The collection member's key for ``number``."""
        assert isinstance(self.members, CollectionMembers) and keys.sort_key is not None
        return {
            keys.partition_key: counter_key[keys.partition_key],
            keys.sort_key: self.members.prefix + str(number).zfill(self.members.width),
        }

    def member_number(self, sort_key: str) -> int | None:
        """The number a collection member's sort key carries, or None if it carries none."""
        assert isinstance(self.members, CollectionMembers)
        digits = sort_key[len(self.members.prefix) :]
        return int(digits) if digits.isascii() and digits.isdigit() else None


Rule = Annotated[CountRule | SumRule | SequenceRule, Field(discriminator="kind")]
AnyRule = CountRule | SumRule | SequenceRule


class _RulesDocument(_Strict):
    table: TableKeys = TableKeys()
    rules: Annotated[list[Rule], Field(min_length=1)]


@dataclass(frozen=True)
class Match:
    """What one item is to one rule."""

    rule: CountRule | SumRule | SequenceRule
    role: Role
    parent_key: Key


class RuleSet:
    """The validated rules, with key classification for writers and the reconciler."""

    def __init__(self, table: TableKeys, rules: list[CountRule | SumRule | SequenceRule]):
        self.table = table
        self.rules = rules
        self._by_name = {rule.name: rule for rule in rules}
        self._compiled: list[tuple[AnyRule, _Checks, Role, _Checks]] | None = None

    def __iter__(self) -> Iterator[CountRule | SumRule | SequenceRule]:
        return iter(self.rules)

    def __getitem__(self, name: str) -> CountRule | SumRule | SequenceRule:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no rule named {name!r}") from None

    def classify(self, key: Mapping[str, Any]) -> list[Match]:
        """Every role the item with this key plays (a parent may hold several counters)."""
        if self._compiled is None:
            self._compiled = [self._compile(rule) for rule in self.rules]
        matches: list[Match] = []
        for rule, parent, role, claimed in self._compiled:
            if _checks_pass(parent, key):
                matches.append(Match(rule, "parent", self.key_of(key)))
            elif _checks_pass(claimed, key):
                matches.append(Match(rule, role, self._parent_of(rule, key)))
        return matches

    def _compile(self, rule: AnyRule) -> tuple[AnyRule, _Checks, Role, _Checks]:
        """The rule's patterns as plain tuples: classify runs once per stream record."""
        parent = _checks(rule.parent_pattern)
        if isinstance(rule, CountRule | SumRule):
            return rule, parent, "child", _checks(rule.child_pattern(self.table))
        return rule, parent, "member", _checks(rule.member_pattern(self.table))

    def _parent_of(self, rule: AnyRule, key: Mapping[str, Any]) -> Key:
        if isinstance(rule, CountRule | SumRule):
            return rule.parent_key_of(key, self.table)
        return self._sequence_counter_key(rule, key)

    def child_match(self, key: Mapping[str, Any]) -> Match:
        """The count or sum rule this key is a child of; ValueError naming the key if none."""
        self.validate_key(key)
        for match in self.classify(key):
            if match.role == "child":
                return match
        raise ValueError(f"key {dict(key)} is not a child of any count or sum rule")

    def counter_match(self, key: Mapping[str, Any]) -> Match:
        """The sequence rule whose counter item this is; ValueError naming the key if none."""
        self.validate_key(key)
        for match in self.classify(key):
            if match.role == "parent" and isinstance(match.rule, SequenceRule):
                return match
        raise ValueError(f"key {dict(key)} is not the counter of any sequence rule")

    def validate_key(self, key: Mapping[str, Any]) -> None:
        expected = set(self.table.names)
        if set(key) != expected:
            raise ValueError(f"key must have exactly the attributes {sorted(expected)}: {key}")
        for name in expected:
            if not isinstance(key[name], str) or not key[name]:
                raise ValueError(f"key attribute {name!r} must be a non-empty string")

    def key_of(self, item: Mapping[str, Any]) -> Key:
        return {name: item[name] for name in self.table.names}

    def _sequence_counter_key(self, rule: SequenceRule, member_key: Mapping[str, Any]) -> Key:
        if isinstance(rule.members, IndexMembers):
            return dict(rule.parent)
        assert self.table.sort_key is not None
        return {
            self.table.partition_key: member_key[self.table.partition_key],
            self.table.sort_key: rule.parent[self.table.sort_key],
        }


def load_rules(path: str | Path | None = None) -> RuleSet:
    """Load and validate a rules file (default: ``$RULES_FILE`` or the bundled example)."""
    path = Path(path or os.environ.get("RULES_FILE") or DEFAULT_RULES_FILE)
    if not path.is_absolute() and not path.exists() and "LAMBDA_TASK_ROOT" in os.environ:
        path = Path(os.environ["LAMBDA_TASK_ROOT"]) / path
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise RulesFileError(f"rules file {path}: {error}") from error
    return parse_rules(raw, source=str(path))


def parse_rules(raw: Mapping[str, Any], source: str = "<rules>") -> RuleSet:
    """Validate a parsed rules document; every problem names the rule and the field."""
    try:
        document = _RulesDocument.model_validate(raw)
    except ValidationError as error:
        raise RulesFileError(_describe(error, raw, source)) from None
    rule_set = RuleSet(document.table, list(document.rules))
    problems = list(_structural_problems(rule_set))
    if problems:
        raise RulesFileError(f"rules file {source}:\n  " + "\n  ".join(problems))
    return rule_set


def _describe(error: ValidationError, raw: Mapping[str, Any], source: str) -> str:
    lines = []
    raw_rules: list[Any] = raw["rules"] if isinstance(raw.get("rules"), list) else []
    for detail in error.errors():
        loc = list(detail["loc"])
        where = ".".join(str(part) for part in loc)
        if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
            index = loc[1]
            entry = raw_rules[index] if index < len(raw_rules) else {}
            name = entry.get("name", f"#{index + 1}") if isinstance(entry, dict) else index
            # Drop the discriminator tag pydantic inserts (e.g. 'count', 'collection').
            fields = [str(part) for part in loc[2:] if not _is_tag(part, entry)]
            where = f"rule {name!r} field {'.'.join(fields) or '(rule)'!r}"
        lines.append(f"{where}: {detail['msg']}")
    return f"rules file {source}:\n  " + "\n  ".join(lines)


def _is_tag(part: object, entry: object) -> bool:
    tags = {"count", "sum", "sequence", "collection", "index"}
    return isinstance(part, str) and part in tags and isinstance(entry, dict)


def _structural_problems(rule_set: RuleSet) -> Iterator[str]:
    keys = rule_set.table
    for rule in rule_set:
        where = f"rule {rule.name!r}"
        for field, names in _pattern_fields(rule, keys):
            if unknown := sorted(set(names) - set(keys.names)):
                yield f"{where} field {field!r}: {unknown} are not key attributes {keys.names}"
        if set(rule.parent) != set(keys.names):
            yield f"{where} field 'parent': needs exactly the key attributes {list(keys.names)}"
        elif any(
            p.is_prefix for name, p in rule.parent_pattern.items() if name != keys.partition_key
        ):
            yield f"{where} field 'parent': the sort key must be exact (one parent per partition)"
        if isinstance(rule, CountRule | SumRule):
            if keys.sort_key is None or set(rule.children) != {keys.sort_key}:
                yield f"{where} field 'children': needs exactly the sort key {keys.sort_key!r}"
            elif not _parse_patterns(rule.children)[keys.sort_key].is_prefix:
                yield f"{where} field 'children': the sort key must be a prefix ending in '*'"
        if isinstance(rule, SequenceRule) and isinstance(rule.members, IndexMembers):
            if any(p.is_prefix for p in rule.parent_pattern.values()):
                yield f"{where} field 'parent': an index-layout sequence has one exact counter key"
        elif isinstance(rule, SequenceRule) and keys.sort_key is None:
            yield f"{where} field 'members.layout': 'collection' needs a table sort key"
    yield from _claim_conflicts(rule_set)


def _pattern_fields(rule: Rule, keys: TableKeys) -> Iterator[tuple[str, Mapping[str, str]]]:
    yield "parent", rule.parent
    if isinstance(rule, CountRule | SumRule):
        yield "children", rule.children
    elif isinstance(rule.members, IndexMembers):
        yield "members.key", rule.members.key


def _claims(rule: Rule, keys: TableKeys) -> list[tuple[str, KeyPattern]]:
    """The (field, key pattern) pairs of items this rule counts as children or members."""
    if isinstance(rule, CountRule | SumRule):
        return [("children", rule.child_pattern(keys))]
    if isinstance(rule.members, CollectionMembers) and keys.sort_key is None:
        return []  # reported: a collection needs a sort key
    return [("members", rule.member_pattern(keys))]


_ROLE = {"children": "child", "members": "member"}


def _claim_conflicts(rule_set: RuleSet) -> Iterator[str]:
    keys = rule_set.table
    if any(_pattern_fields_unknown(r, keys) for r in rule_set):
        return  # the problems already reported make the claims meaningless
    rules = list(rule_set)
    for i, rule in enumerate(rules):
        for field, pattern in _claims(rule, keys):
            for other in rules:
                if _overlap(pattern, other.parent_pattern):
                    yield (
                        f"rule {rule.name!r} field {field!r}: matches the parent of rule "
                        f"{other.name!r}, so an item would be both parent and {_ROLE[field]}"
                    )
            for other in rules[i + 1 :]:
                for other_field, other_pattern in _claims(other, keys):
                    if _overlap(pattern, other_pattern):
                        yield (
                            f"rule {other.name!r} field {other_field!r}: claims items that rule "
                            f"{rule.name!r} field {field!r} already claims"
                        )
        for other in rules[i + 1 :]:
            # A shared revision is fine (it fences both counters); a shared counter is not.
            same_counter = other.counter in (rule.counter, rule.revision) or (
                rule.counter == other.revision
            )
            if same_counter and _overlap(rule.parent_pattern, other.parent_pattern):
                yield (
                    f"rule {other.name!r} field 'counter': parent items and attribute "
                    f"{other.counter!r} are already claimed by rule {rule.name!r}"
                )


def _pattern_fields_unknown(rule: Rule, keys: TableKeys) -> bool:
    return any(set(names) - set(keys.names) for _, names in _pattern_fields(rule, keys))
