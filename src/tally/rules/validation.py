"""Rules file validation beyond field types: what needs the table's key schema, and conflicts.

Every problem names the rule and the field, so one error message tells the author what to fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import ValidationError

from tally.rules.rule_base import MAX_NAME_LENGTH
from tally.rules.rule_set import AnyRule, RuleSet
from tally.rules.sequence_rules import (
    AttributeMembers,
    CollectionMembers,
    IndexMembers,
    PartitionMembers,
    SequenceRule,
)
from tally.rules.table_keys import KeyPattern, TableKeys
from tally.rules.tally_rules import SumRule, TallyRule


def _overlap(a: KeyPattern, b: KeyPattern) -> bool:
    """True when some key matches both (an attribute one side leaves open matches anything)."""
    return all(a[name].overlaps(b[name]) for name in a.keys() & b.keys())


def describe(error: ValidationError, raw: Mapping[str, Any], source: str) -> str:
    lines = []
    raw_rules: list[Any] = raw["rules"] if isinstance(raw.get("rules"), list) else []
    for detail in error.errors():
        loc = list(detail["loc"])
        where = ".".join(str(part) for part in loc)
        if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
            index = loc[1]
            entry = raw_rules[index] if index < len(raw_rules) else {}
            name = entry.get("name") if isinstance(entry, dict) else None
            # Drop the discriminator tag pydantic inserts (e.g. 'count', 'collection').
            fields = [str(part) for part in loc[2:] if not _is_tag(part, entry)]
            where = f"rule {_label(name, index)} field {'.'.join(fields) or '(rule)'!r}"
        message = str(detail["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return f"rules file {source}:\n  " + "\n  ".join(lines)


def _label(name: object, index: int) -> str:
    """How a message names a rule: its name, cut short when too long to be one, else its
    position in the file."""
    if not isinstance(name, str) or not name:
        return f"#{index + 1}"
    if len(name) <= MAX_NAME_LENGTH:
        return repr(name)
    return f"{name[:24] + '...'!r} (a name of {len(name)} characters)"


def _is_tag(part: object, entry: object) -> bool:
    tags = {"count", "sum", "sequence", "collection", "partition", "index"}
    return isinstance(part, str) and part in tags and isinstance(entry, dict)


# --- structure: what pydantic cannot know without the table's key schema ----------------


def structural_problems(rule_set: RuleSet) -> Iterator[str]:
    keys = rule_set.table
    clashes = list(_name_and_attribute_clashes(rule_set))
    yield from clashes
    broken = bool(clashes)
    for rule in rule_set:
        problems = list(_rule_problems(rule, keys))
        broken = broken or bool(problems)
        yield from (f"rule {rule.name!r} {problem}" for problem in problems)
    if not broken:  # otherwise the patterns are meaningless and overlaps would only add noise
        yield from _claim_conflicts(rule_set)


def _name_and_attribute_clashes(rule_set: RuleSet) -> Iterator[str]:
    """Two rules of one name; a counter or revision on a key attribute, the TTL attribute, or
    each other: attributes a rule writes that DynamoDB or another rule needs untouched."""
    keys = rule_set.table
    first: dict[str, int] = {}
    for index, rule in enumerate(rule_set, start=1):
        if rule.name in first:
            yield (
                f"rule {rule.name!r} field 'name': another rule has this name "
                f"(rule #{first[rule.name]} and rule #{index})"
            )
        first.setdefault(rule.name, index)
        written: dict[str, str | None] = {"revision": rule.revision}
        if not isinstance(rule, SequenceRule) or rule.has_counter:
            written = {"counter": rule.counter, "revision": rule.revision}
        for field, attribute in written.items():
            if attribute is None:
                continue
            if attribute in keys.names:
                yield (
                    f"rule {rule.name!r} field {field!r}: {attribute!r} is a key attribute of "
                    f"the table; a {field} cannot be one"
                )
            elif attribute == keys.ttl_attribute:
                yield (
                    f"rule {rule.name!r} field {field!r}: {attribute!r} is the table's "
                    f"ttl_attribute (DynamoDB would delete the parent when the {field} reads "
                    "as a past time)"
                )
        if rule.revision is not None and rule.revision == written.get("counter"):
            yield (
                f"rule {rule.name!r} field 'revision': {rule.revision!r} is the rule's counter; "
                "the revision must be an attribute of its own"
            )


def _rule_problems(rule: AnyRule, keys: TableKeys) -> Iterator[str]:
    for field, raw in _pattern_fields(rule):
        if unknown := sorted(set(raw) - set(keys.names)):
            yield f"field {field!r}: {unknown} are not key attributes {list(keys.names)}"
            return
        for name, text in raw.items():
            try:
                keys.pattern(name, text)
            except ValueError as error:
                yield f"field {field!r}: {name} {error}"
                return
    parent = keys.patterns(rule.parent)
    exact_parent = not any(p.is_prefix for p in parent.values())
    if set(rule.parent) != set(keys.names):
        yield f"field 'parent': needs exactly the key attributes {list(keys.names)}"
        return
    if keys.sort_key is not None and parent[keys.sort_key].is_prefix:
        yield "field 'parent': the sort key must be exact (one parent per partition)"
    if isinstance(rule, TallyRule):
        yield from _children_problems(rule, keys)
        return
    members = rule.members
    if isinstance(members, IndexMembers | AttributeMembers):
        if not exact_parent:
            yield f"field 'parent': an {members.layout}-layout sequence has one exact counter key"
        return
    if isinstance(members, CollectionMembers):
        if keys.sort_key is None:
            yield "field 'members.layout': 'collection' needs a table sort key; see 'partition'"
        elif set(members.key) != {keys.sort_key}:
            yield f"field 'members': a collection numbers the sort key: {keys.sort_key} = ..."
        else:
            yield from _numbered_problems(members, keys.sort_key, keys)
        return
    if not exact_parent:
        yield "field 'parent': a partition-layout sequence has one exact counter key"
    if set(members.key) != set(keys.names):
        yield f"field 'members': a partition layout names the key attributes {list(keys.names)}"
        return
    yield from _numbered_problems(members, keys.partition_key, keys)
    if (
        keys.sort_key is not None
        and keys.pattern(keys.sort_key, members.key[keys.sort_key]).is_prefix
    ):
        yield f"field 'members.{keys.sort_key}': the sort key must be exact"


def _children_problems(rule: TallyRule, keys: TableKeys) -> Iterator[str]:
    if rule.through is not None:
        yield from _indexed_children_problems(rule, keys)
    elif keys.sort_key is None:
        yield (
            f"field 'kind': a {rule.kind} rule needs a table sort key "
            "(children share their parent's partition)"
        )
    elif set(rule.children) != {keys.sort_key}:
        yield f"field 'children': needs exactly the sort key {keys.sort_key!r}"
    elif not rule.children_pattern(keys).is_prefix:
        what = "'*'" if keys.numeric(keys.sort_key) else "a prefix ending in '*'"
        yield f"field 'children': the sort key must be {what}"
    elif rule.split is not None:
        yield from _split_problems(rule, keys)


def _split_problems(rule: TallyRule, keys: TableKeys) -> Iterator[str]:
    """A split counter's shards (``<parent SK>#REGION#<Region>``) need a string sort key,
    and must never be taken for its children."""
    assert keys.sort_key is not None
    if keys.numeric(keys.sort_key):
        yield (
            f"field 'split': its shards' sort key is the parent's followed by '#REGION#' and "
            f"the Region: the table's sort key {keys.sort_key!r} must be a string"
        )
    elif rule.children_pattern(keys).overlaps(rule.shard_pattern(keys)[keys.sort_key]):
        yield (
            f"field 'split': its shards' keys ({keys.sort_key} = "
            f"{rule.shard_prefix(keys)!r}<Region>) match its children "
            f"({keys.sort_key} = {str(rule.children_pattern(keys))!r}): pick children or a "
            "parent sort key that cannot meet"
        )


def _indexed_children_problems(rule: TallyRule, keys: TableKeys) -> Iterator[str]:
    through = rule.through
    assert through is not None
    if not rule.children:
        yield "field 'children': name the children's key pattern (e.g. SK = \"FOLLOWS#*\")"
    if through.partition_key == keys.partition_key:
        yield (
            "field 'through.partition_key': it is the table's partition key: children in "
            "their parent's item collection need no index (drop 'through')"
        )
    if not rule.parent_pattern(keys)[keys.partition_key].is_prefix:
        yield (
            f"field 'parent': children found through an index name many parents: "
            f'{keys.partition_key} = "PREFIX#*"'
        )
    if rule.on_ttl_expiry == "decrement":
        yield (
            "field 'on_ttl_expiry': 'decrement' is not offered for children found through an "
            "index; an expired child is a drift the recount finds (use 'alert')"
        )
    if taken := sorted(set(through.stamp_attributes) & {*keys.names, keys.ttl_attribute}):
        yield f"field 'through.stamp': its attributes {taken} are the table's keys or TTL"
    if rule.repair == "auto" and rule.revision is None:
        yield (
            "field 'revision': children found through an index are repaired only with a "
            "revision the writers bump: without one, a counter that went A->B->A between "
            "two looks would pass for one that held still (or use repair = 'alert')"
        )
    if isinstance(rule, SumRule) and rule.summed in through.attributes:
        yield f"field 'summed': {rule.summed!r} is a key of the index, not an amount"


def _numbered_problems(
    members: CollectionMembers | PartitionMembers, attribute: str, keys: TableKeys
) -> Iterator[str]:
    text = members.key[attribute]
    if not keys.pattern(attribute, text).is_prefix:
        what = "'*' (the number itself)" if keys.numeric(attribute) else "a prefix ending in '*'"
        yield f"field 'members.{attribute}': {text!r} must be {what} (the number follows it)"


def _pattern_fields(rule: AnyRule) -> Iterator[tuple[str, Mapping[str, str]]]:
    yield "parent", rule.parent
    if isinstance(rule, TallyRule):
        yield "children", rule.children
    else:
        yield "members", rule.members.key


def _claims(rule: AnyRule, keys: TableKeys) -> list[tuple[str, KeyPattern]]:
    """The (field, key pattern) pairs of items this rule counts as children or members."""
    if isinstance(rule, TallyRule):
        claims = [("children", rule.child_pattern(keys))]
        if rule.split is not None:
            claims.append(("split", rule.shard_pattern(keys)))
        return claims
    return [("members", rule.member_pattern(keys))]


_ROLE = {"children": "child", "members": "member", "split": "shard"}


def _claim_conflicts(rule_set: RuleSet) -> Iterator[str]:
    keys = rule_set.table
    rules = list(rule_set)
    for i, rule in enumerate(rules):
        for field, pattern in _claims(rule, keys):
            for other in rules:
                if _overlap(pattern, other.parent_pattern(keys)):
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
            if same_counter and _overlap(rule.parent_pattern(keys), other.parent_pattern(keys)):
                yield (
                    f"rule {other.name!r} field 'counter': parent items and attribute "
                    f"{other.counter!r} are already claimed by rule {rule.name!r}"
                )
