"""From stream records to per-(rule, parent) groups of changes, with no reads.

Each record is classified by the rules (parent, child, sequence counter, sequence member,
or unrelated) and folded into its group: counter deltas on one side, child deltas (or
member numbers) on the other. Only the attributes a rule names are deserialized. Nothing
in a record can raise out of here: a record that cannot be read makes its group unbalanced
(so the table itself is consulted), or, without readable keys, is counted as malformed.
A record carrying a fresh repair marker is set aside as a claim: whether it is the
reconciler's own write is for the audit table to say, not the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from decimal import Decimal
from typing import Any, cast

from tally.core.numbers import add, subtract
from tally.core.stamps import key_mark
from tally.reconciler.findings import Evidence, shown
from tally.reconciler.protocol import lifecycle, stamps
from tally.reconciler.protocol.judgement import valid_counter
from tally.reconciler.protocol.window import Noted, key_id
from tally.reconciler.stream.changes import (
    Batch,
    Claim,
    Expiry,
    Group,
    Invalid,
    LedgerChange,
)
from tally.reconciler.stream.images import (
    MISSING,
    amount,
    attr,
    marker_change,
    member_number,
    record_keys,
    removed_by_ttl,
    shown_value,
)
from tally.rules import (
    AnyRule,
    AttributeMembers,
    Key,
    Match,
    RuleSet,
    SequenceRule,
    SumRule,
    TallyRule,
)


def group_records(records: Iterable[Any], rules: RuleSet) -> Batch:
    """Fold raw stream records (Lambda's event shape) into groups; never raises per record."""
    batch = Batch()
    for record in records:
        batch.records += 1
        fold_record(batch, record, rules)
    return batch


def fold_record(batch: Batch, record: Any, rules: RuleSet, *, claimed: bool = False) -> None:
    """Fold one record into its groups; ``claimed``: its marker claim was already refused."""
    try:
        stream = record["dynamodb"]
        keys = record_keys(stream["Keys"])
        sequence_number = str(stream["SequenceNumber"])
        int(sequence_number)  # a sequence number is a decimal string
        matches = rules.classify(keys)
    except Exception:
        # Without keys or a sequence number nothing can be verified or retried: log it.
        event_id = record.get("eventID", "?") if isinstance(record, Mapping) else "?"
        batch.malformed.append(str(event_id))
        return
    if not matches:
        batch.skipped += 1
        return
    at = stream.get("ApproximateCreationDateTime")  # formatted only if it ends up in a finding
    event: str | None = None
    try:
        new = stream.get("NewImage") or {}
        old = stream.get("OldImage") or {}
        marker = None if claimed else marker_change(old, new)
        if marker is not None:
            batch.claims.append(Claim(record, marker, keys))
            return
        event = str(record["eventName"])
    except Exception:
        event = None
    groups: list[tuple[Group, Match, Mapping[str, Any], Mapping[str, Any]]] = []
    logged = False
    for match in matches:
        if match.role != "indexed":
            groups.append((batch.group(match), match, old, new))
            continue
        try:
            named = [_named_by(match.rule, rules, image) for image in (old, new)]
        except Exception:
            # An index key no writer could store: no parent of this rule is known to verify
            # (logged); the record's other roles are folded as usual.
            batch.malformed.append(str(record.get("eventID", "?")))
            logged = True
            continue
        for parent in dict.fromkeys(key_id(p) for p in named if p is not None):
            # Each parent sees the images that name it: a re-parented child is -1 on one
            # group and +1 on the other; an image that names another parent counts 0 here.
            images = [
                i if n is not None and key_id(n) == parent else {}
                for i, n in zip((old, new), named, strict=True)
            ]
            group = batch.group(replace(match, parent_key=dict(parent)))
            groups.append((group, match, images[0], images[1]))
    if not groups:
        if not logged:
            batch.skipped += 1  # an item found through an index that is no child, then or now
        return
    for group, match, before, after in groups:
        group.sequence_numbers.append(sequence_number)
        if group.first_at is None and at is not None:
            group.first_at = at
        if event is None:
            group.unreadable += 1
            continue
        try:
            _fold_match(group, match, (record, event, keys, before, after, sequence_number, at))
        except Exception:
            # A value no writer could have stored (NaN, 39 digits...): let the table decide.
            group.unreadable += 1


# One readable record as one group sees it (the images that name its parent): record, event,
# keys, old image, new image, sequence number, stream time. A plain tuple: made per record.
_Seen = tuple[Mapping[str, Any], str, Key, Mapping[str, Any], Mapping[str, Any], str, Any]


def _fold_match(group: Group, match: Match, seen: _Seen) -> None:
    if match.role == "parent":
        _fold_parent(group, seen)
    elif match.role == "shard":
        _fold_shard(group, seen)
    elif match.role == "child":
        _fold_child(group, seen)
    elif match.role == "indexed":
        _fold_child(group, seen, by_image=True)
    else:
        _, _, keys, old, new, sequence_number, _ = seen
        number = (
            member_number(match.rule, keys, old),
            member_number(match.rule, keys, new),
        )
        _fold_member(group, seen, number)
        rule = match.rule
        ledgered = isinstance(rule, SequenceRule) and isinstance(rule.members, AttributeMembers)
        if ledgered and number[0] != number[1]:
            group.ledger.append(LedgerChange(keys, *number, sequence_number))


def _fold_parent(group: Group, seen: _Seen) -> None:
    _, event, keys, old, new, sequence_number, at = seen
    rule = group.rule
    before, after = attr(old, rule.counter), attr(new, rule.counter)
    if getattr(rule, "through", None) is not None:
        group.parent_state = _state_after(rule, event, after, new)
    evidence = Evidence(sequence_number, event, keys, shown_value(before), shown_value(after), at)
    if event == "REMOVE":
        group.parent_removed = True
        group.evidence.append(evidence)
        return
    if before == after:
        return  # the counter did not move: nothing to balance
    if not _writers_parent_change(rule, old, new):
        group.unstamped_change = True
    group.evidence.append(evidence)
    if not valid_counter(rule, after, absent=MISSING):
        group.invalid.append(Invalid(keys, rule.counter, shown(after), evidence))
        return
    # An absent counter reads as 0: a writer (or a rogue) may REMOVE it or put the item anew.
    before_n = before if isinstance(before, Decimal) else Decimal(0)
    after_n = after if isinstance(after, Decimal) else Decimal(0)
    if isinstance(rule, SequenceRule):
        if after_n > before_n:
            group.handed_out.append((int(before_n) + 1, int(after_n)))
        elif after_n < before_n:
            group.decreases.append(evidence)  # a sequence never goes backwards
        group.counter_seen = max(group.counter_seen, int(after_n), int(before_n))
    else:
        delta = subtract(after_n, before_n)
        group.counter_delta = add(group.counter_delta, delta)
        if group.counter_before is None:
            group.counter_before = before_n
        group.deltas.append((sequence_number, delta))


def _fold_shard(group: Group, seen: _Seen) -> None:
    """One Region's shard of a counter split per Region: its change is the counter's (the
    counter is the parent's base and every shard's). A shard removed takes its part away."""
    _, event, keys, old, new, sequence_number, at = seen
    rule = group.rule
    before, after = attr(old, rule.counter), attr(new, rule.counter)
    if before == after:
        return
    evidence = Evidence(sequence_number, event, keys, shown_value(before), shown_value(after), at)
    group.evidence.append(evidence)
    if not valid_number(after):
        group.invalid.append(Invalid(keys, rule.counter, shown(after), evidence))
        return
    before_n = before if isinstance(before, Decimal) else Decimal(0)
    after_n = after if isinstance(after, Decimal) else Decimal(0)
    delta = subtract(after_n, before_n)
    group.counter_delta = add(group.counter_delta, delta)
    group.deltas.append((sequence_number, delta))


def valid_number(value: Any) -> bool:
    """A shard's part: absent (0) or a finite number; a count's shard may be negative (a
    Region removes children another Region made), so only the total is judged whole."""
    return value is MISSING or (isinstance(value, Decimal) and value.is_finite())


def _state_after(rule: AnyRule, event: str, counter: Any, new: Mapping[str, Any]) -> str:
    revision = attr(new, rule.revision) if rule.revision else MISSING
    state = lifecycle.state_of(
        event != "REMOVE",
        None if counter is MISSING else counter,
        None if revision is MISSING else revision,
    )
    through = rule.through if isinstance(rule, TallyRule) else None
    if through is None or through.stamp is None:
        return state
    assert through.stamp_total is not None
    total = attr(new, through.stamp_total)
    return stamps.stamped_state(
        state, attr(new, through.stamps[0]), None if total is MISSING else total
    )


def _fold_child(group: Group, seen: _Seen, *, by_image: bool = False) -> None:
    """``by_image``: a count is told by the images (a child found through an index counts
    while an image names the group's parent), not by the event."""
    record, event, keys, old, new, sequence_number, at = seen
    rule = group.rule
    if isinstance(rule, SumRule):
        before, after = amount(old, rule.summed), amount(new, rule.summed)
        for value, image in ((before, old), (after, new)):
            if value is None and image:
                invalid = shown(attr(image, rule.summed))
                evidence = Evidence(sequence_number, event, keys, at=at)
                group.invalid.append(Invalid(keys, rule.summed, invalid, evidence))
                if by_image:  # only the table can say what counts
                    tokens = _tokens(rule, old, new)
                    noted = Noted(keys, sequence_number, None, None, _at(at), tokens)
                    group.indexed_children.append(noted)
                return
        delta = subtract(after or Decimal(0), before or Decimal(0))
    elif by_image:
        delta = Decimal(bool(new) - bool(old))
    else:
        delta = Decimal({"INSERT": 1, "REMOVE": -1}.get(event, 0))
    if by_image and (delta != 0 or bool(new) != bool(old)):
        summed = after if isinstance(rule, SumRule) and new else None
        tokens = _tokens(rule, old, new)
        noted = Noted(keys, sequence_number, bool(new), summed, _at(at), tokens)
        group.indexed_children.append(noted)
        _expect_stamp(group, record, keys, joins=bool(new))
    if delta == 0:
        return
    evidence = Evidence(sequence_number, event, keys, at=at)
    group.evidence.append(evidence)
    if event == "REMOVE" and removed_by_ttl(record) and isinstance(rule, TallyRule):
        if rule.on_ttl_expiry == "decrement":
            group.expiries.append(
                Expiry(keys, delta.copy_negate(), str(record["eventID"]), evidence)
            )
            return
        group.ttl_removed = True
    group.child_delta = add(group.child_delta, delta)
    group.deltas.append((sequence_number, delta.copy_negate()))


def _tokens(rule: AnyRule, old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """The writers' tokens a child's images show for the group's parent (none unstamped)."""
    stamp = rule.through.stamp if isinstance(rule, TallyRule) and rule.through else None
    if stamp is None:
        return ()
    token, old_token = (attr(image, stamp) if image else None for image in (new, old))
    return stamps.shown_by(token, bool(new), old_token)


def _writers_parent_change(rule: AnyRule, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """A parent record a stamped writer made (``protocol.stamps.writers_parent_change``)."""
    through = rule.through if isinstance(rule, TallyRule) else None
    if through is None or through.stamp_total is None:
        return False
    values = [
        tuple(None if (v := attr(image, name)) is MISSING else v for image in (old, new))
        for name in (rule.counter, through.stamp_total, rule.revision or "")
    ]
    places = [
        tuple("" if (v := attr(image, name)) is MISSING else v for name in through.stamps)
        for image in (old, new)
    ]
    counters, totals, revisions = (cast(tuple[Any, Any], v) for v in values)
    return stamps.writers_parent_change(counters, totals, revisions, (places[0], places[1]))


def _expect_stamp(group: Group, record: Mapping[str, Any], keys: Key, *, joins: bool) -> None:
    """What this child record expects on the group's parent, if a stamped writer made it:
    read from the record's own images (the group's may hide one that names another parent)."""
    rule = group.rule
    stamp = rule.through.stamp if isinstance(rule, TallyRule) and rule.through else None
    if stamp is None:
        return
    stream = record["dynamodb"]
    new, old = (attr(stream.get(name) or {}, stamp) for name in ("NewImage", "OldImage"))
    expected = stamps.expected_stamp(new, old, joins)
    mark = key_mark(keys)
    if expected is not None and stamps.stamp_mark(expected) != mark:
        expected = None  # a token another child's key made: copied, not written
    group.stamped_children.setdefault(key_id(keys), (mark, []))[1].append(expected)


def _at(at: Any) -> float:
    """A record's stream time in epoch seconds, 0 when it has none that is plausible."""
    return float(at) if isinstance(at, int | float | Decimal) and 0 < at < 10**11 else 0.0


def _named_by(rule: AnyRule, rules: RuleSet, image: Mapping[str, Any]) -> Key | None:
    """The parent a child found through an index names in one image (None: none); only the
    index's key attributes are deserialized."""
    assert isinstance(rule, TallyRule) and rule.through is not None
    values = {name: attr(image, name) for name in rule.through.attributes}
    present = {name: value for name, value in values.items() if value is not MISSING}
    return rule.indexed_parent(present, rules.table)


def _fold_member(group: Group, seen: _Seen, numbers: tuple[int | None, int | None]) -> None:
    before, after = numbers
    if before == after:
        return
    _, event, keys, _, _, sequence_number, at = seen
    evidence = Evidence(sequence_number, event, keys, before, after, at)
    group.evidence.append(evidence)
    if before is not None:
        group.members_removed += 1
        group.lowest_given_up = min(before, group.lowest_given_up or before)
        group.highest_given_up = max(before, group.highest_given_up)
    if after is not None:
        group.inserted[after] += 1
    group.highest_member = max(group.highest_member, before or 0, after or 0)
