"""``tally rules suggest``: counter rules read off a sample of a live table, as TOML to review.

A parent's numeric attribute is proposed as
- a ``count`` when it equals the number of items of its collection under a sort-key prefix,
- a ``sum`` when it equals the total of one numeric attribute over those items,
- a ``sequence`` when it equals the highest number of the items numbered after a prefix,
with how many sampled parents agree. On a table without a sort key, a counter at or above
the highest number keyed as prefix + number elsewhere is a sequence over partitions: a
sample only bounds that number from below, so two point reads confirm it (that member
present, the next one absent). A scan returns whole item collections, so only the last
sampled collection may be cut short; it is left out when others remain.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

import tomlkit
from tomlkit.items import KeyType, SingleKey, String, StringType, Table, Trivia

from tally.core.dynamodb import serialize
from tally.core.numbers import exact_sum
from tally.rules import RulesFileError, TableKeys, parse_rules
from tally.rules.key_patterns import key_text
from tally.rules.live_table import TableShape, collections

Kind = Literal["count", "sum", "sequence"]
AGREEMENT = 0.8  # share of sampled parents a proposal must hold for
_KIND_ORDER = {"sequence": 0, "count": 1, "sum": 2}  # on a tie: numbering says most
_SEPARATORS = "#:|/"
_NUMBERED = re.compile(r"^(.*?)([0-9]+)$")
_CONFIRMATIONS = 20  # point reads a partition-layout proposal may spend, in pairs
# What a TOML comment may not hold (TOML 1.0: control characters other than tab).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True)
class Shape:
    """One proposal's identity: which parents, which counter, which items, which invariant."""

    kind: Kind
    parent_sk: str | None
    counter: str
    span: str  # the children's or members' sort-key prefix ("" on a number sort key)
    numbered: bool
    summed: str | None = None


@dataclass
class Proposal:
    shape: Shape
    parents: list[str] = field(default_factory=list)  # partition keys of sampled parents
    held: int = 0
    widths: list[str] = field(default_factory=list)  # members' number texts, for the width
    partition: bool = False

    @property
    def agreement(self) -> float:
        return self.held / len(self.parents) if self.parents else 0.0


def suggest(
    client: Any, shape: TableShape, items: Sequence[Mapping[str, Any]], limit: int
) -> list[Proposal]:
    """Proposals that hold for most sampled parents and make a valid rules file together."""
    keys = shape.keys
    if keys.sort_key is None:
        found = list(_partition_proposals(client, shape, items))
    else:
        groups = collections(items, keys)
        if len(items) >= limit and len(groups) > 1:
            groups.pop(list(groups)[-1])  # the scan stopped inside it
        found = _collection_proposals(list(groups.values()), keys)
    ranked = sorted(
        (p for p in found if p.agreement >= AGREEMENT),
        key=lambda p: (-p.agreement, -p.held, _KIND_ORDER[p.shape.kind], len(p.shape.span)),
    )
    return compatible(keys, ranked)


def compatible(keys: TableKeys, ranked: Sequence[Proposal]) -> list[Proposal]:
    """The proposals, best first, that make a valid rules file with those kept before them."""
    accepted: list[Proposal] = []
    for proposal in ranked:
        try:
            parse_rules(document(keys, [*accepted, proposal]))
        except RulesFileError:
            continue  # claims what an earlier, better-supported proposal claims
        accepted.append(proposal)
    return accepted


# --- item collections ------------------------------------------------------------------


def _collection_proposals(groups: list[list[Any]], keys: TableKeys) -> list[Proposal]:
    sk = keys.sort_key
    assert sk is not None
    numeric = keys.numeric(sk)
    shapes: set[Shape] = set()
    for members in groups:
        spans = {span for item in members for span in _spans(item[sk], numeric)}
        claimed = {span: [m for m in members if _in_span(m[sk], *span, numeric)] for span in spans}
        for parent in members:
            for counter, value in _numbers(parent, keys):
                if value == 0:
                    continue  # an empty collection agrees with any guess
                for span, items in claimed.items():
                    if not _in_span(parent[sk], *span, numeric):
                        shapes |= _holding(key_text(parent[sk]), counter, value, items, span, keys)
    proposals = []
    for shape in shapes:
        proposal = Proposal(shape)
        for members in groups:
            _weigh(proposal, members, keys)
        proposals.append(proposal)
    return proposals


def _holding(
    parent_sk: str,
    counter: str,
    value: Decimal,
    claimed: list[Any],
    span: tuple[str, bool],
    keys: TableKeys,
) -> set[Shape]:
    """The shapes one parent's counter fits, against one span of its collection."""
    prefix, numbered = span
    if numbered:
        if value == max(_number(m, prefix, keys) for m in claimed):
            return {Shape("sequence", parent_sk, counter, prefix, True)}
        return set()
    found = set()
    if value == len(claimed):
        found.add(Shape("count", parent_sk, counter, prefix, False))
    for summed in {n for m in claimed for n, _ in _numbers(m, keys)}:
        if value == exact_sum(_amount(m, summed) for m in claimed):
            found.add(Shape("sum", parent_sk, counter, prefix, False, summed))
    return found


def _weigh(proposal: Proposal, members: list[Any], keys: TableKeys) -> None:
    """Add this collection's parent (if it has one) to the proposal's evidence."""
    shape, sk = proposal.shape, keys.sort_key
    parents = [m for m in members if key_text(m[sk]) == shape.parent_sk]
    if not parents or not isinstance(parents[0].get(shape.counter), Decimal):
        return
    parent = parents[0]
    claimed = _claimed(members, parent, shape.span, shape.numbered, keys)
    if shape.kind == "count":
        truth = Decimal(len(claimed))
    elif shape.kind == "sum":
        assert shape.summed is not None
        truth = exact_sum(_amount(m, shape.summed) for m in claimed)
    else:
        truth = Decimal(max((_number(m, shape.span, keys) for m in claimed), default=0))
        proposal.widths += [key_text(m[sk])[len(shape.span) :] for m in claimed]
    proposal.parents.append(key_text(parent[keys.partition_key]))
    proposal.held += parent[shape.counter] == truth


def _spans(value: Any, numeric: bool) -> Iterator[tuple[str, bool]]:
    """The prefixes a sort key value could be counted under: at separators, before digits."""
    if numeric:
        yield "", False
        if value == value.to_integral_value() and value > 0:
            yield "", True
        return
    for i, char in enumerate(value[:-1]):
        if char in _SEPARATORS:
            yield value[: i + 1], False
    if found := _NUMBERED.match(value):
        yield found[1], True


def _in_span(value: Any, span: str, numbered: bool, numeric: bool) -> bool:
    if numeric:
        return bool(value > 0) and (not numbered or value == value.to_integral_value())
    if not value.startswith(span):
        return False
    rest = value[len(span) :]
    return rest.isascii() and rest.isdigit() if numbered else True


def _claimed(
    members: list[Any], parent: Any, span: str, numbered: bool, keys: TableKeys
) -> list[Any]:
    sk = keys.sort_key
    numeric = keys.numeric(sk) if sk else False
    return [m for m in members if m is not parent and _in_span(m[sk], span, numbered, numeric)]


def _number(item: Mapping[str, Any], span: str, keys: TableKeys) -> int:
    assert keys.sort_key is not None
    return int(key_text(item[keys.sort_key])[len(span) :])


def _numbers(item: Mapping[str, Any], keys: TableKeys) -> Iterator[tuple[str, Decimal]]:
    """The item's finite number attributes, keys aside."""
    for name, value in item.items():
        if name not in keys.names and isinstance(value, Decimal) and value.is_finite():
            yield name, value


def _amount(item: Mapping[str, Any], attribute: str) -> Decimal:
    value = item.get(attribute)
    return value if isinstance(value, Decimal) and value.is_finite() else Decimal(0)


# --- partitions keyed by their number (no sort key) -------------------------------------


def _partition_proposals(
    client: Any, shape: TableShape, items: Sequence[Mapping[str, Any]]
) -> Iterator[Proposal]:
    keys = shape.keys
    pk = keys.partition_key
    families: dict[str, list[str]] = {}
    for item in items:
        if found := _NUMBERED.match(key_text(item[pk])):
            families.setdefault(found[1], []).append(found[2])
    reads = _CONFIRMATIONS
    for prefix, digits in families.items():
        if len(digits) < 2:
            continue
        highest, width = max(int(d) for d in digits), _width(digits)
        for parent in items:
            text = key_text(parent[pk])
            if text.startswith(prefix) and text[len(prefix) :].isdigit():
                continue
            for counter, value in _numbers(parent, keys):
                if value < highest or value != value.to_integral_value() or reads <= 0:
                    continue
                reads -= 1
                member = _member(keys, prefix, width)
                present = _exists(client, shape.name, keys, member(int(value)))
                if present and not _exists(client, shape.name, keys, member(int(value) + 1)):
                    proposal = Proposal(Shape("sequence", None, counter, prefix, True), [text], 1)
                    proposal.widths, proposal.partition = digits, True
                    yield proposal


def _member(keys: TableKeys, prefix: str, width: int) -> Any:
    numeric = keys.numeric(keys.partition_key)
    return lambda n: {keys.partition_key: str(n) if numeric else prefix + str(n).zfill(width)}


def _exists(client: Any, table: str, keys: TableKeys, key: Mapping[str, str]) -> bool:
    response = client.get_item(TableName=table, Key=serialize(keys.typed(key)), ConsistentRead=True)
    return "Item" in response


def _width(digits: Sequence[str]) -> int:
    """Zero padding shows as a leading zero; without one, numbers are written as they are."""
    padded = [d for d in digits if len(d) > 1 and d.startswith("0")]
    return len(padded[0]) if padded else 1


# --- the rules file ---------------------------------------------------------------------


def document(keys: TableKeys, proposals: Sequence[Proposal]) -> dict[str, Any]:
    """The proposals as a rules document (what ``render`` writes as TOML)."""
    table: dict[str, Any] = {"partition_key": keys.partition_key}
    if keys.partition_key_type != "S":
        table["partition_key_type"] = keys.partition_key_type
    if keys.sort_key is not None:
        table["sort_key"] = keys.sort_key
        if keys.sort_key_type != "S":
            table["sort_key_type"] = keys.sort_key_type
    names: set[str] = set()
    return {"table": table, "rules": [_rule(keys, p, names) for p in proposals]}


def _rule(keys: TableKeys, proposal: Proposal, names: set[str]) -> dict[str, Any]:
    shape, pk, sk = proposal.shape, keys.partition_key, keys.sort_key
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", shape.counter)
    base, n = name, 1
    while name in names:
        n += 1
        name = f"{base}-{n}"
    names.add(name)
    rule: dict[str, Any] = {"name": name, "kind": shape.kind}
    if proposal.partition:
        rule["parent"] = {pk: proposal.parents[0]}
    else:
        assert sk is not None and shape.parent_sk is not None
        rule["parent"] = {pk: _parent_pattern(proposal.parents, keys), sk: shape.parent_sk}
    span = shape.span + "*"
    if shape.kind == "sequence":
        attribute = pk if proposal.partition else sk
        assert attribute is not None
        layout = "partition" if proposal.partition else "collection"
        rule["members"] = {"layout": layout, attribute: span}
        if not keys.numeric(attribute):
            rule["members"]["width"] = _width(proposal.widths)
    else:
        assert sk is not None
        rule["children"] = {sk: span}
    rule["counter"] = shape.counter
    if shape.summed is not None:
        rule["summed"] = shape.summed
    rule["repair"] = "alert"
    return rule


def _parent_pattern(parents: Sequence[str], keys: TableKeys) -> str:
    """The parents' common prefix, cut back to a separator: POST#a91f, POST#a92c -> POST#*."""
    distinct = sorted(set(parents))
    if keys.numeric(keys.partition_key):
        return distinct[0] if len(distinct) == 1 else "*"
    if len(distinct) == 1:
        value = distinct[0]
        cut = max(value.rfind(c) for c in _SEPARATORS)
        return value[: cut + 1] + "*" if cut >= 0 else value
    common = distinct[0]
    for value in distinct[1:]:
        while not value.startswith(common):
            common = common[:-1]
    cut = max(common.rfind(c) for c in _SEPARATORS)
    return (common[: cut + 1] if cut >= 0 else common) + "*"


def render(table: str, sampled: int, keys: TableKeys, proposals: Sequence[Proposal]) -> str:
    """The proposals as a commented TOML rules file, written by tomlkit (any text escaped)."""
    raw = document(keys, proposals)
    file = tomlkit.document()
    for line in (
        f"Proposed by `tally rules suggest` from {sampled} sampled items of table {table}.",
        "Each rule is a claim about your writers: review it, then `tally rules check` it.",
    ):
        file.add(tomlkit.comment(line))
    file.add(tomlkit.nl())
    # tomlkit keeps a comment above a [[rules]] header at the end of the table before it.
    above = _section(raw["table"])
    file.add("table", above)
    rules = tomlkit.aot()
    for proposal, rule in zip(proposals, raw["rules"], strict=True):
        above.add(tomlkit.nl())
        above.add(tomlkit.comment(_printable(_why(proposal))))
        above = _section(rule)
        rules.append(above)
    file.add("rules", rules)
    for section in rules:
        section.trivia.indent = ""  # the blank line goes above the comment, not below it
    return tomlkit.dumps(file)


def _section(values: Mapping[str, Any]) -> Table:
    """A table whose mappings are written inline, spaced as ``{ PK = "POST#*" }``."""
    section = tomlkit.table()
    for key, value in values.items():
        if isinstance(value, Mapping):
            inline = tomlkit.inline_table()
            inline.append(None, tomlkit.ws(" "))
            for name, text in value.items():
                inline.append(_key(name), _value(text))
            inline.append(None, tomlkit.ws(" "))
            value = inline
        section.add(key, _value(value))
    return section


# tomlkit writes TOML 1.1, whose ESC escape (\e) tomllib (TOML 1.0) refuses: names and key
# values (any text DynamoDB holds) have it written as \u001b instead.
def _key(name: str) -> SingleKey:
    if "\x1b" not in name:
        return SingleKey(name)
    return SingleKey(name, KeyType.Basic, original=f'"{_escaped(name)}"')


def _value(value: Any) -> Any:
    if isinstance(value, str):
        return String(StringType.SLB, value, _escaped(value), Trivia())
    return value


def _escaped(text: str) -> str:
    return "\\u001b".join(tomlkit.string(part).as_string()[1:-1] for part in text.split("\x1b"))


def _why(proposal: Proposal) -> str:
    shape = proposal.shape
    of = f"{shape.span}* items" if shape.span else "numbered items"
    what = {
        "count": f"the number of {of}",
        "sum": f"the sum of {shape.summed} over {of}",
        "sequence": f"the highest number of the {of}",
    }[shape.kind]
    if proposal.partition:
        return f"{shape.counter} equals {what} (confirmed by reading that member and the next)"
    return f"{shape.counter} equals {what} for {proposal.held} of {len(proposal.parents)} parents"


def _printable(text: str) -> str:
    """Text a TOML comment can hold: its control characters (a newline ends the comment)
    written as escapes."""
    return _CONTROL.sub(lambda found: found[0].encode("unicode_escape").decode(), text)
