"""Count and sum rules: a parent's counter tallies its children, their number or the sum of
one of their attributes.

Children share their parent's partition key (the table needs a sort key for them), or live
in other item collections and are found through an index (``through``: index_children).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Context, Decimal, localcontext
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tally.rules.index_children import IndexChildren
from tally.rules.key_patterns import Pattern, key_text
from tally.rules.rule_base import RuleBase
from tally.rules.table_keys import Key, KeyPattern, TableKeys

# Between a parent's sort key and a Region's name in the sort key of that Region's shard.
SHARD_MARK = "#REGION#"


class _TallyRule(RuleBase):
    children: dict[str, str]
    # Children in other item collections, found through an index (None: the parent's own).
    through: IndexChildren | None = None
    # "decrement": a child removed by TTL is a legitimate decrement the reconciler applies.
    on_ttl_expiry: Literal["alert", "decrement"] = "alert"
    # Set when a stream aggregator keeps the counter: it may trail its children this long.
    lag_seconds: Annotated[int, Field(ge=1, le=900)] | None = None
    # "region": on a Global Table the counter is split per Region (docs/global-tables.md): a
    # shard item per Region beside the parent, each written by its own Region's writers only,
    # the count the parent's own counter (a base) plus every shard's.
    split: Literal["region"] | None = None

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

    @field_validator("split")
    @classmethod
    def _split(cls, split: str | None, info: ValidationInfo) -> str | None:
        # A shard sits in its parent's item collection, written in the child's transaction.
        if split is None:
            return split
        if info.data.get("through") is not None:
            raise ValueError(
                "a counter split per Region keeps its shards in the parent's item collection, "
                "beside its children: children found through an index ('through') are not "
                "offered"
            )
        if info.data.get("lag_seconds") is not None:
            raise ValueError(
                "a counter kept by a stream aggregator (lag_seconds) is written by the "
                "aggregator alone; only the product's writers write shards"
            )
        if info.data.get("on_ttl_expiry") == "decrement":
            raise ValueError(
                "on_ttl_expiry = 'decrement' is not offered on a split counter; an expired "
                "child is a drift the recount finds (use 'alert')"
            )
        return split

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

    def shard_prefix(self, keys: TableKeys) -> str:
        """The sort key every shard of a split counter starts with: the parent's, then
        ``#REGION#`` (the Region's name follows)."""
        assert keys.sort_key is not None
        return f"{self.exact_parent(keys)[keys.sort_key]}{SHARD_MARK}"

    def shard_pattern(self, keys: TableKeys) -> KeyPattern:
        """The keys of a split counter's shards: the parent's partition, the shard prefix."""
        assert keys.sort_key is not None
        pattern = {keys.partition_key: self.parent_pattern(keys)[keys.partition_key]}
        pattern[keys.sort_key] = Pattern(self.shard_prefix(keys), True)
        return pattern

    def shard_key(self, parent_key: Key, region: str, keys: TableKeys) -> Key:
        """The key of ``region``'s shard of the parent at ``parent_key``."""
        assert keys.sort_key is not None
        return {**parent_key, keys.sort_key: f"{self.shard_prefix(keys)}{region}"}

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


TallyRule = CountRule | SumRule  # a rule whose counter tallies children: a count or a sum
