"""The rules file as a whole, and the rule set that classifies keys: which role an item with a
given key plays for which rule (parent, child, member, or a child found through an index)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import Field

from tally.rules.key_patterns import (
    EXACT,
    NUMBERED,
    PREFIX,
    Checks,
    checks_pass,
    key_text,
    number_text,
    parse_number,
)
from tally.rules.sequence_rules import CollectionMembers, SequenceRule
from tally.rules.table_keys import PK_SK, Key, KeyPattern, Strict, TableKeys
from tally.rules.tally_rules import TallyRule

# "indexed": a child found through an index; its parent is named by its image, not its key.
# "shard": one Region's part of a counter split per Region (``split``), beside its parent.
Role = Literal["parent", "child", "member", "indexed", "shard"]

AnyRule = TallyRule | SequenceRule
Rule = Annotated[AnyRule, Field(discriminator="kind")]


class RulesDocument(Strict):
    # Without a [table] section the table is the example's: PK and SK, both strings.
    table: TableKeys = PK_SK
    rules: Annotated[list[Rule], Field(min_length=1)]


def _checks(pattern: KeyPattern) -> Checks:
    return tuple(p.check(name) for name, p in pattern.items())


@dataclass(frozen=True)
class Match:
    """What one item is to one rule (an ``indexed`` child's parent is in its image: the
    match's ``parent_key`` is empty)."""

    rule: AnyRule
    role: Role
    parent_key: Key


ParentOf = Callable[[Mapping[str, Any]], Key]


class _Compiled(NamedTuple):
    """A rule compiled for classify: the checks a key passes as its parent, and as one of the
    items it claims (children or members), with the parent key of such an item."""

    rule: AnyRule
    parent: Checks
    role: Role
    claimed: Checks
    parent_of: ParentOf


def _head(checks: Checks, partition_key: str) -> str | None:
    """The partition key head (text before the first '#') every key passing ``checks`` has;
    None when the checks leave it open."""
    for name, value, mode in checks:
        if name != partition_key:
            continue
        if mode in (EXACT, PREFIX, NUMBERED) and "#" in value:
            return value.split("#", 1)[0]
        return value if mode == EXACT else None
    return None


def _unnamed(_: Mapping[str, Any]) -> Key:
    return {}


def _split(rule: AnyRule) -> bool:
    return isinstance(rule, TallyRule) and rule.split is not None


class RuleSet:
    """The validated rules, with key classification for writers and the reconciler."""

    def __init__(self, table: TableKeys, rules: list[AnyRule]):
        self.table = table
        self.rules = rules
        self._by_name = {rule.name: rule for rule in rules}
        self._compiled: list[_Compiled] | None = None
        # Partition key head (text before its first '#') -> the compiled rules it may match.
        self._by_head: dict[str, list[_Compiled]] = {}
        self._any_head: list[_Compiled] = []
        self._numeric_keys = any(table.type_of(name) == "N" for name in table.names)

    def __iter__(self) -> Iterator[AnyRule]:
        return iter(self.rules)

    def __getitem__(self, name: str) -> AnyRule:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no rule named {name!r}") from None

    def classify(self, key: Mapping[str, Any]) -> list[Match]:
        """Every role the item with this key plays (a parent may hold several counters)."""
        if self._compiled is None:
            self._compile_all()
        pk = key.get(self.table.partition_key)
        if pk.__class__ is str:
            head = pk.split("#", 1)[0]
            candidates = self._by_head.get(head, self._any_head)
        else:
            candidates = self._compiled or []
        matches: list[Match] = []
        for rule, parent, role, claimed, parent_of in candidates:
            if checks_pass(parent, key):
                matches.append(Match(rule, "parent", self.key_of(key)))
            elif checks_pass(claimed, key):
                matches.append(Match(rule, role, parent_of(key)))
        return matches

    def _compile_all(self) -> None:
        compiled = [self._compile(rule) for rule in self.rules]
        compiled += [self._compile_shards(rule) for rule in self.rules if _split(rule)]
        pk = self.table.partition_key
        heads = [(_head(c.parent, pk), _head(c.claimed, pk)) for c in compiled]
        fixed = {head for pair in heads for head in pair if head is not None}
        self._any_head = [c for c, pair in zip(compiled, heads, strict=True) if None in pair]
        self._by_head = {
            head: [
                c for c, pair in zip(compiled, heads, strict=True) if head in pair or None in pair
            ]
            for head in fixed
        }
        self._compiled = compiled

    def _compile(self, rule: AnyRule) -> _Compiled:
        """The rule's patterns as plain tuples: classify runs once per stream record."""
        keys = self.table
        parent = _checks(rule.parent_pattern(keys))
        pk = keys.partition_key
        if isinstance(rule, SequenceRule) and not isinstance(rule.members, CollectionMembers):
            counter = rule.exact_parent(keys)
            return _Compiled(
                rule, parent, "member", _checks(rule.member_pattern(keys)), lambda _: dict(counter)
            )
        if isinstance(rule, TallyRule) and rule.through is not None:
            # Its parent is in its image (rule.indexed_parent), old and new: not in its key.
            return _Compiled(rule, parent, "indexed", _checks(rule.child_pattern(keys)), _unnamed)
        assert keys.sort_key is not None
        sk, parent_sk = keys.sort_key, rule.exact_parent(keys).get(keys.sort_key, "")
        if keys.numeric(pk):

            def parent_of(key: Mapping[str, Any]) -> Key:
                return {pk: key_text(key[pk]), sk: parent_sk}
        else:

            def parent_of(key: Mapping[str, Any]) -> Key:
                return {pk: key[pk], sk: parent_sk}

        if isinstance(rule, SequenceRule):
            return _Compiled(rule, parent, "member", _checks(rule.member_pattern(keys)), parent_of)
        return _Compiled(rule, parent, "child", _checks(rule.child_pattern(keys)), parent_of)

    def _compile_shards(self, rule: AnyRule) -> _Compiled:
        """A split counter's shards: their parent is the item of the same partition at the
        parent's sort key. Their entry's parent checks never pass (its parent has an entry of
        its own): the parent's, and a sort key that is empty, which no DynamoDB key is."""
        keys = self.table
        pk, sk = keys.partition_key, keys.sort_key
        assert isinstance(rule, TallyRule) and sk is not None
        never = (*_checks(rule.parent_pattern(keys)), (sk, "", EXACT))
        parent_sk = rule.exact_parent(keys)[sk]

        def parent_of(key: Mapping[str, Any]) -> Key:
            return {pk: key_text(key[pk]), sk: parent_sk}

        return _Compiled(rule, never, "shard", _checks(rule.shard_pattern(keys)), parent_of)

    def claimed_by(self, rule: AnyRule) -> Callable[[Mapping[str, Any]], bool]:
        """Whether a key is one of the items ``rule`` counts (children or members): the key
        alone, whatever its image says."""
        checks = _checks(
            rule.member_pattern(self.table)
            if isinstance(rule, SequenceRule)
            else rule.child_pattern(self.table)
        )
        return lambda key: checks_pass(checks, key)

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
        for name in self.table.names:
            value = key[name]
            if not isinstance(value, str) or not value:
                raise ValueError(f"key attribute {name!r} must be a non-empty string")
            if self.table.type_of(name) == "N":
                canonical = number_text(parse_number(value))
                if value != canonical:
                    raise ValueError(f"key attribute {name!r} is a number: write {canonical!r}")

    def key_of(self, item: Mapping[str, Any]) -> Key:
        """The item's key, as text (numbers in DynamoDB's canonical form)."""
        if self._numeric_keys:
            return {name: key_text(item[name]) for name in self.table.names}
        return {name: item[name] for name in self.table.names}
