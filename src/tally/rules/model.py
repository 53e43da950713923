"""The rules model: the declared counter invariants and the key classification they give.

The ``[table]`` section names the table's key attributes and their types. Children of a
count or sum rule share their parent's partition key: the table needs a sort key for them.
Sequence members sit in the counter's item collection (``collection``), each in a partition
of its own keyed by the number (``partition``), are found through a GSI (``index``), or carry
their number in an attribute under a natural key (``attribute``: the reconciler keeps a
ledger of them from the stream).
Key values are text everywhere (numbers in DynamoDB's canonical form, see key_patterns);
``TableKeys.typed`` turns them back into what DynamoDB expects at the call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Context, Decimal, localcontext
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tally.rules.key_patterns import (
    EXACT,
    NUMBERED,
    PREFIX,
    Checks,
    KeyType,
    Pattern,
    checks_pass,
    key_text,
    number_text,
    parse_number,
)

Key = dict[str, str]
KeyPattern = dict[str, Pattern]
RepairMode = Literal["auto", "alert", "off"]
# "indexed": a child found through an index; its parent is named by its image, not its key.
Role = Literal["parent", "child", "member", "indexed"]

# Set by every reconciler write on the counted table; no writer may set it (docs/verification.md).
REPAIR_MARKER = "tallyRepair"
# A rule's name goes into alerts, metric dimensions and audit-table keys (docs/rules.md).
MAX_NAME_LENGTH = 64


def _checks(pattern: KeyPattern) -> Checks:
    return tuple(p.check(name) for name, p in pattern.items())


class _Strict(BaseModel):
    # Numbers written without quotes (sk = 0) are key values like any other.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


def _key_names(partition_key: str, sort_key: str | None) -> tuple[str, ...]:
    """A table's or an index's key attributes: the partition key, then any sort key."""
    return (partition_key,) if sort_key is None else (partition_key, sort_key)


class TableKeys(_Strict):
    """The table's key schema: a partition key and, optionally, a sort key; S or N each."""

    partition_key: Annotated[str, Field(min_length=1)]
    sort_key: Annotated[str, Field(min_length=1)] | None = None
    partition_key_type: KeyType = "S"
    sort_key_type: KeyType = "S"
    # The table's TTL attribute, if it has one: writers keep it off items an expiry would break.
    ttl_attribute: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> TableKeys:
        if self.sort_key == self.partition_key:
            raise ValueError("sort_key must differ from partition_key")
        if self.ttl_attribute is not None and self.ttl_attribute in self.names:
            raise ValueError("ttl_attribute must not be a key attribute")
        if self.sort_key is None and "sort_key_type" in self.model_fields_set:
            raise ValueError("sort_key_type is set but the table has no sort_key")
        return self

    @property
    def names(self) -> tuple[str, ...]:
        return _key_names(self.partition_key, self.sort_key)

    def type_of(self, name: str) -> KeyType:
        return self.sort_key_type if name == self.sort_key else self.partition_key_type

    def numeric(self, name: str) -> bool:
        return name in self.names and self.type_of(name) == "N"

    def pattern(self, name: str, text: str, *, numbered: bool = False) -> Pattern:
        return Pattern.parse(text, numeric=self.numeric(name), numbered=numbered)

    def patterns(self, raw: Mapping[str, str]) -> KeyPattern:
        return {name: self.pattern(name, text) for name, text in raw.items()}

    def typed(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """The item with its number key attributes as Decimal, ready to serialize."""
        out = dict(item)
        for name in self.names:
            if self.type_of(name) == "N" and isinstance(out.get(name), str):
                out[name] = Decimal(out[name])
        return out


PK_SK = TableKeys(partition_key="PK", sort_key="SK")
# How long children may outlive their parent before they are orphans (a rule option).
ORPHAN_GRACE_SECONDS = 60


def _context_keys(info: ValidationInfo) -> TableKeys:
    found = (info.context or {}).get("table")
    return found if isinstance(found, TableKeys) else PK_SK


class _RuleBase(_Strict):
    name: Annotated[
        str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[A-Za-z0-9_.-]+$")
    ]
    parent: dict[str, str]
    counter: Annotated[str, Field(min_length=1)]
    revision: str | None = None
    repair: RepairMode = "alert"
    # Children (or members) whose parent (or counter item) is gone are left for a while by
    # an application's cascade: they are judged only once they persisted this long.
    orphan_grace_seconds: Annotated[int, Field(ge=0, le=900)] = ORPHAN_GRACE_SECONDS

    def parent_pattern(self, keys: TableKeys) -> KeyPattern:
        return keys.patterns(self.parent)

    def exact_parent(self, keys: TableKeys) -> Key:
        """The parent key in canonical text (every attribute exact)."""
        return {name: p.value for name, p in self.parent_pattern(keys).items()}


# How long a child's write may take to reach an index before a recount trusts it.
INDEX_GRACE_SECONDS = 2
# How long a child's change the stream showed counts as the stream showed it, not as the
# index does: far longer than any lag an index is seen to have (docs/verification.md).
INDEX_WINDOW_SECONDS = 900


class IndexChildren(_Strict):
    """Children in other item collections, found through a global secondary index.

    A child names its parent in the index's partition key attribute, whose value is the
    parent's partition key value (an inverted index: a follow edge ``PK = USER#<follower>``
    carries ``GSI1PK = USER#<followee>``). An item without it is no child (a sparse index);
    with ``sort_prefix``, only items whose index sort key begins with it are (a status such
    as ``FOLLOWING#``). The index is eventually consistent: ``grace_seconds`` is how long a
    write usually takes to show in it; for ``window_seconds`` after the stream showed a
    child change, the child counts as the stream showed it instead (docs/verification.md,
    "Children found through an index").
    """

    index: Annotated[str, Field(min_length=1)]
    partition_key: Annotated[str, Field(min_length=1)]
    sort_key: Annotated[str, Field(min_length=1)] | None = None
    sort_prefix: Annotated[str, Field(min_length=1)] | None = None
    grace_seconds: Annotated[int, Field(ge=1, le=900)] = INDEX_GRACE_SECONDS
    # None: INDEX_WINDOW_SECONDS, or ten graces when that is longer.
    window_seconds: Annotated[int, Field(ge=60, le=86_400)] | None = None
    # The product's writers stamp each change: a fresh token on the child (in this
    # attribute), and on the parent the last ``stamp_depth`` tokens, newest first, in
    # ``<stamp>0`` ... (docs/verification.md, "Parents that never rest"). None: no stamps.
    stamp: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    stamp_depth: Annotated[int, Field(ge=2, le=64)] = 16

    @model_validator(mode="after")
    def _consistent(self) -> IndexChildren:
        if self.window_seconds is not None and self.window_seconds <= 2 * self.grace_seconds:
            raise ValueError("window_seconds must be more than twice grace_seconds")
        if self.sort_prefix is not None and self.sort_key is None:
            raise ValueError("sort_prefix needs the index's sort_key")
        if self.sort_key == self.partition_key:
            raise ValueError("sort_key must differ from partition_key")
        if set(self.stamp_attributes) & set(self.attributes):
            raise ValueError("stamp's attributes must differ from the index's key attributes")
        return self

    @property
    def attributes(self) -> tuple[str, ...]:
        """The index's key attributes, as the children carry them."""
        return _key_names(self.partition_key, self.sort_key)

    @property
    def window(self) -> int:
        """Seconds a child's change counts as the stream showed it, not as the index does."""
        if self.window_seconds is not None:
            return self.window_seconds
        return max(INDEX_WINDOW_SECONDS, 10 * self.grace_seconds)

    @property
    def stamps(self) -> tuple[str, ...]:
        """The parent's stamp attributes, newest first (none without ``stamp``)."""
        if self.stamp is None:
            return ()
        return tuple(f"{self.stamp}{place}" for place in range(self.stamp_depth))

    @property
    def stamp_child(self) -> str | None:
        """The parent's attribute naming the child of its newest stamp."""
        return None if self.stamp is None else f"{self.stamp}Child"

    @property
    def stamp_total(self) -> str | None:
        """The parent's attribute the writers add each stamped change's delta to."""
        return None if self.stamp is None else f"{self.stamp}Total"

    @property
    def stamp_attributes(self) -> tuple[str, ...]:
        """Every attribute the stamps take, on the child and on the parent."""
        if self.stamp is None:
            return ()
        assert self.stamp_child is not None and self.stamp_total is not None
        return (self.stamp, *self.stamps, self.stamp_child, self.stamp_total)


class _TallyRule(_RuleBase):
    children: dict[str, str]
    # Children in other item collections, found through an index (None: the parent's own).
    through: IndexChildren | None = None
    # "decrement": a child removed by TTL is a legitimate decrement the reconciler applies.
    on_ttl_expiry: Literal["alert", "decrement"] = "alert"
    # Set when a stream aggregator keeps the counter: it may trail its children this long.
    lag_seconds: Annotated[int, Field(ge=1, le=900)] | None = None

    @field_validator("lag_seconds")
    @classmethod
    def _aggregated(cls, lag: int | None, info: ValidationInfo) -> int | None:
        # The aggregator applies every delta itself: a second writer would count it twice.
        if lag is not None and info.data.get("repair") == "auto":
            raise ValueError(
                "a counter kept by a stream aggregator is never repaired (a repair would "
                "race its pending deltas); use repair = 'alert'"
            )
        if lag is not None and info.data.get("on_ttl_expiry") == "decrement":
            raise ValueError(
                "the aggregator applies TTL removals itself; "
                "on_ttl_expiry = 'decrement' would apply them twice"
            )
        return lag

    @model_validator(mode="after")
    def _stamped(self) -> _TallyRule:
        # A look proves a moving parent's revisions by their stamps: one per revision.
        through = self.through
        if through is None or through.stamp is None:
            return self
        if self.revision is None:
            raise ValueError("through.stamp needs the rule's revision: a stamp names one")
        if self.lag_seconds is not None:
            raise ValueError("through.stamp is for the product's writers, not an aggregator")
        summed = getattr(self, "summed", None)
        taken = {self.counter, self.revision, summed} & set(through.stamp_attributes)
        if taken:
            names = sorted(str(name) for name in taken)
            raise ValueError(f"through.stamp's attributes must differ from {names}")
        return self

    def child_pattern(self, keys: TableKeys) -> KeyPattern:
        """Children share the parent's partition key pattern and narrow the sort key; children
        found through an index have a key pattern of their own."""
        if self.through is not None:
            return keys.patterns(self.children)
        pattern = {keys.partition_key: self.parent_pattern(keys)[keys.partition_key]}
        pattern.update(keys.patterns(self.children))
        return pattern

    def indexed_parent(self, image: Mapping[str, Any], keys: TableKeys) -> Key | None:
        """The parent a child found through an index names in ``image``; None when the image
        is no child of this rule's (no index key, another status, no parent of the rule's).

        ``image`` is deserialized; only the index's key attributes are read.
        """
        through = self.through
        assert through is not None
        value = image.get(through.partition_key)
        # The index key holds the parent's partition key value, of the same type: a value of
        # another type is one the index cannot hold (DynamoDB refuses the write).
        if not isinstance(value, Decimal if keys.numeric(keys.partition_key) else str):
            return None
        named = key_text(value)
        if not named:
            return None
        if through.sort_prefix is not None:
            status = image.get(through.sort_key or "")
            if not isinstance(status, str) or not status.startswith(through.sort_prefix):
                return None
        pattern = self.parent_pattern(keys)
        if not pattern[keys.partition_key].matches(named):
            return None
        key = {name: p.value for name, p in pattern.items()}
        key[keys.partition_key] = named
        return key

    def children_pattern(self, keys: TableKeys) -> Pattern:
        """The children's sort key pattern: a prefix, or any positive number."""
        assert keys.sort_key is not None
        return keys.pattern(keys.sort_key, self.children[keys.sort_key])


class CountRule(_TallyRule):
    """The parent's counter equals the number of its children."""

    kind: Literal["count"]


# DynamoDB keeps 38 significant digits; a sum rule's amounts must leave its totals room to grow.
SUM_DIGITS = 38


class SumRule(_TallyRule):
    """The parent's counter equals the sum of ``summed`` over its children.

    ``scale`` (decimal places) and ``max_amount`` (largest absolute value) are the amount
    domain the writers accept: every amount is a multiple of 10**-scale, so every total is
    too, and stays exact in DynamoDB's 38 digits (docs/rules.md, "The amount domain").
    """

    kind: Literal["sum"]
    summed: Annotated[str, Field(min_length=1)]
    scale: Annotated[int, Field(ge=0, le=SUM_DIGITS - 1)] = 2
    max_amount: Decimal = Decimal("1E+15")

    @field_validator("max_amount")
    @classmethod
    def _amount_domain(cls, maximum: Decimal, info: ValidationInfo) -> Decimal:
        scale = info.data.get("scale", 2)
        if not maximum.is_finite() or maximum <= 0:
            raise ValueError("max_amount must be a positive number")
        digits = max(maximum.adjusted() + 1, 1) + scale
        if digits > SUM_DIGITS:
            raise ValueError(
                f"max_amount {maximum} with scale {scale} needs {digits} digits; "
                f"DynamoDB keeps {SUM_DIGITS}"
            )
        with localcontext(Context(prec=2 * SUM_DIGITS)):
            if maximum % Decimal(1).scaleb(-scale) != 0:
                raise ValueError(f"max_amount {maximum} has more decimal places than scale")
            return maximum.quantize(Decimal(1).scaleb(-scale)).normalize()


class _NumberedMembers(_Strict):
    """Members whose key carries their number: prefix + number zero-padded to ``width``.

    The pattern is written as a field named after the key attribute (``SK = "ISSUE#*"``);
    it is gathered into ``key``.
    """

    key: dict[str, str]
    width: Annotated[int, Field(ge=1, le=38)] = 10

    @model_validator(mode="before")
    @classmethod
    def _gather_key_fields(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        keys = _context_keys(info)
        named = {name: data[name] for name in keys.names if name in data}
        if not named and "key" not in data:
            wanted = keys.sort_key if data.get("layout") == "collection" else keys.partition_key
            if wanted is None:
                raise ValueError("'collection' needs a table sort key; see layout 'partition'")
            others = sorted(set(data) - {"layout", "width"})
            raise ValueError(
                f'name the key attribute that carries the number: {wanted} = "PREFIX#*"'
                + (f" (not {', '.join(others)})" if others else "")
            )
        if not named:
            return data
        rest = {field: value for field, value in data.items() if field not in named}
        return rest | {"key": named}

    @property
    def attribute(self) -> str:
        """The key attribute that carries the number."""
        starred = [name for name, text in self.key.items() if text.endswith("*")]
        return starred[0] if starred else next(iter(self.key))

    @property
    def prefix(self) -> str:
        return self.key[self.attribute].removesuffix("*")


class CollectionMembers(_NumberedMembers):
    """Members in the counter's item collection: sort key = prefix + number."""

    layout: Literal["collection"]


class PartitionMembers(_NumberedMembers):
    """Members each in a partition of their own: partition key = prefix + number
    (orders numbered by an atomic counter, say)."""

    layout: Literal["partition"]


class IndexMembers(_Strict):
    """Members keyed by a natural key, found through a sparse GSI (sequence, number)."""

    layout: Literal["index"]
    key: dict[str, str]
    index: Annotated[str, Field(min_length=1)]
    sequence_attribute: Annotated[str, Field(min_length=1)]
    number: Annotated[str, Field(min_length=1)]
    sequence: str | None = None


class AttributeMembers(_Strict):
    """Members keyed by a natural key, their number in an attribute (users keyed by
    name, numbered by a gapless counter, say).

    No key or index leads from a number to its member: the reconciler keeps a ledger
    (number -> member key) in the audit table from the stream; the full audit rebuilds it.
    """

    layout: Literal["attribute"]
    key: dict[str, str]
    number: Annotated[str, Field(min_length=1)]


Members = CollectionMembers | PartitionMembers | IndexMembers | AttributeMembers
# What a sequence's counter holds: the last number handed out, the next free one, or no
# counter at all (members only: the highest member is the sequence's end).
CounterHolds = Literal["last", "next", "none"]
# The counter attribute of a members-only sequence: no item carries it.
NO_COUNTER = "-"


class SequenceRule(_RuleBase):
    """The counter equals the highest number handed out; 1..counter each present once.

    ``counter_holds = "next"``: the counter is the next free number and numbering starts
    at 0, so member ``n`` is the sequence's (n+1)-th; internally every number is that
    ordinal (``ordinal``/``shown_number`` translate). ``"none"``: no counter item.
    """

    kind: Literal["sequence"]
    members: Annotated[Members, Field(discriminator="layout")]
    grace_seconds: Annotated[int, Field(ge=0, le=900)] = 60
    counter_holds: CounterHolds = "last"

    @model_validator(mode="before")
    @classmethod
    def _no_counter(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("counter_holds") != "none":
            return data
        if "counter" in data or "revision" in data:
            raise ValueError(
                "counter_holds = 'none' is a sequence without a counter: drop 'counter'"
            )
        return data | {"counter": NO_COUNTER}

    @property
    def has_counter(self) -> bool:
        return self.counter_holds != "none"

    def ordinal(self, number: int) -> int:
        """The position of a member's number in the sequence (1 = first)."""
        return number + 1 if self.counter_holds == "next" else number

    def shown_number(self, ordinal: int) -> int:
        """The member's own number for an ordinal: what findings show."""
        return ordinal - 1 if self.counter_holds == "next" else ordinal

    @property
    def sequence_name(self) -> str:
        """The GSI partition value naming this sequence (index layout)."""
        assert isinstance(self.members, IndexMembers)
        return self.members.sequence or self.name

    def member_pattern(self, keys: TableKeys) -> KeyPattern:
        members = self.members
        if isinstance(members, IndexMembers | AttributeMembers):
            return keys.patterns(members.key)
        pattern = keys.patterns({n: t for n, t in members.key.items() if n != members.attribute})
        number = members.attribute
        pattern[number] = keys.pattern(number, members.key[number], numbered=True)
        if isinstance(members, CollectionMembers):
            pattern[keys.partition_key] = self.parent_pattern(keys)[keys.partition_key]
        return pattern

    def member_key(self, counter_key: Mapping[str, str], number: int, keys: TableKeys) -> Key:
        """The key of the member at ordinal ``number`` (collection and partition layouts)."""
        members = self.members
        assert isinstance(members, CollectionMembers | PartitionMembers)
        attribute = members.attribute
        text = str(self.shown_number(number))
        if not keys.numeric(attribute):
            text = members.prefix + text.zfill(members.width)
        if isinstance(members, CollectionMembers):
            return {keys.partition_key: counter_key[keys.partition_key], attribute: text}
        return {name: p.value for name, p in keys.patterns(members.key).items()} | {attribute: text}

    def member_number(self, value: Any) -> int | None:
        """The ordinal a member's numbered key value carries, or None if it carries none."""
        members = self.members
        assert isinstance(members, CollectionMembers | PartitionMembers)
        text = key_text(value)
        if not isinstance(text, str) or not text.startswith(members.prefix):
            return None
        digits = text[len(members.prefix) :]
        return self.ordinal(int(digits)) if digits.isascii() and digits.isdigit() else None

    def attribute_number(self, value: Any) -> int | None:
        """The ordinal a member's number attribute carries, or None if it is no number."""
        if not isinstance(value, Decimal) or not value.is_finite() or value != int(value):
            return None
        ordinal = self.ordinal(int(value))
        return ordinal if ordinal > 0 else None


TallyRule = CountRule | SumRule  # a rule whose counter tallies children: a count or a sum
AnyRule = TallyRule | SequenceRule
Rule = Annotated[AnyRule, Field(discriminator="kind")]


class RulesDocument(_Strict):
    # Without a [table] section the table is the example's: PK and SK, both strings.
    table: TableKeys = PK_SK
    rules: Annotated[list[Rule], Field(min_length=1)]


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
