"""Changes that attest themselves (protocol.stamps: ``writers_parent_change``,
``expected_stamp``, ``attested``). Checked against a model of one child's history under one
parent, written by stamped writers and by outsiders who delete it, put it unstamped, keep its
token while changing it, or write back any version it ever had: whenever the child ends in a
state the parent's counter does not account for, at least one of its records is not
attested, wherever after it the parent is read."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.stamps import key_mark, removed
from tally.reconciler.protocol import stamps

CHILD = {"PK": "USER#dan", "SK": "FOLLOWS#ann"}
OTHER = {"PK": "USER#zed", "SK": "FOLLOWS#ann"}
MARK = key_mark(CHILD)
WRITERS = ["join", "change", "leave"]
OUTSIDERS = ["delete", "put", "keep", "write-back"]


def token(n: int, child: dict[str, str] = CHILD) -> str:
    """The n-th token a writer made (one a millisecond), for a change of ``child``."""
    return f"{1_795_000_000_000 + n:011x}{key_mark(child)}{n % 0xFFFFFFF:07x}"


@dataclass(frozen=True)
class Record:
    old: str | None  # the child's token before (None: absent or unstamped)
    new: str | None
    present: bool  # the child names the parent after the record
    was_present: bool
    stamps_after: int  # how many stamps the parent held when the record was made


def play(events: list[tuple[str, int]]) -> tuple[list[Record], list[str], bool, bool]:
    """The child's records, the parent's stamps (oldest first), whether the child ends named
    by the parent and whether the writers' last change left it so (what the counter holds)."""
    versions: list[tuple[bool, str | None]] = [(False, None)]  # every state the child had
    present, current = False, None
    counted = False  # what the writers' changes left the counter counting
    held: list[str] = []
    records: list[Record] = []
    for n, (event, pick) in enumerate(events):
        old, was_present = (current if present else None), present
        if (event == "join" and not present) or (event == "change" and present):
            current, present = token(n), True
            held.append(current)
            counted = True
        elif event == "leave" and present:
            stamp = removed(current) or f"?{token(n)}"
            held.append(stamp)
            present, current, counted = False, None, False
        elif event == "delete" and present:
            present, current = False, None
        elif event == "put":
            present, current = True, None
        elif event == "keep" and present:
            pass  # changed, its token kept
        elif event == "write-back":
            present, current = versions[pick % len(versions)]
        else:
            continue
        versions.append((present, current))
        new = current if present else None
        records.append(Record(old, new, present, was_present, len(held)))
    return records, held, present, counted


EVENTS = st.lists(st.tuples(st.sampled_from(WRITERS + OUTSIDERS), st.integers(0, 50)), max_size=12)


def attested(record: Record, held: list[str], read_at: int, depth: int) -> bool:
    """The record judged on the parent's stamps as a consistent read after it finds them."""
    newest_first = list(reversed(held[:read_at]))[:depth]
    expected = stamps.expected_stamp(record.new, record.old, record.present)
    return stamps.attested(newest_first, [(MARK, [expected])])


@settings(max_examples=3000)
@given(EVENTS, st.integers(1, 8), st.data())
def test_a_child_left_where_the_counter_does_not_count_it_has_a_record_not_attested(
    events: list[tuple[str, int]], depth: int, data: st.DataObject
) -> None:
    records, held, present, counted = play(events)
    # A count is told by membership: a record that leaves it as it was is not looked at.
    records = [r for r in records if r.present != r.was_present]
    reads = [data.draw(st.integers(r.stamps_after, len(held))) for r in records]
    verdicts = [attested(r, held, at, depth) for r, at in zip(records, reads, strict=True)]
    if present != counted:
        assert not all(verdicts)


@settings(max_examples=1000)
@given(st.lists(st.sampled_from(WRITERS), max_size=12), st.integers(1, 8))
def test_the_writers_own_changes_attest_themselves_read_before_the_next(
    events: list[str], depth: int
) -> None:
    records, held, present, counted = play([(e, 0) for e in events])
    assert present == counted
    for record in records:
        assert attested(record, held, record.stamps_after, depth)


def test_a_change_read_after_a_later_change_of_the_same_child_is_not_attested() -> None:
    records, held, _, _ = play([("join", 0), ("change", 0)])
    assert not attested(records[0], held, len(held), 8)
    assert stamps.attested(list(reversed(held)), [(MARK, [records[0].new, records[1].new])])


def test_a_token_made_for_another_childs_key_or_kept_attests_nothing() -> None:
    mine, theirs = token(1), token(1, OTHER)
    assert stamps.expected_stamp(mine, None, True) == mine
    assert stamps.expected_stamp(mine, mine, True) is None  # kept
    assert stamps.expected_stamp(f"-{mine}", None, True) is None
    assert stamps.expected_stamp(None, mine, False) == f"-{mine}"
    assert stamps.expected_stamp(None, None, False) is None  # never stamped: no pair
    assert stamps.stamp_mark(theirs) != MARK
    assert not stamps.attested([theirs, mine], [(MARK, [theirs])])
    assert not stamps.attested([mine], [(MARK, [mine]), (MARK, [mine])])  # two, one mark


PLACES = 4


def parent(
    counter: int, total: int, revision: int, places: list[str]
) -> tuple[Decimal, Decimal, Decimal, tuple[str, ...]]:
    return Decimal(counter), Decimal(total), Decimal(revision), tuple(places)


@settings(max_examples=1000)
@given(
    st.integers(0, 10),
    st.integers(0, 10),
    st.integers(0, 10),
    st.integers(-3, 3),
    st.integers(-3, 3),
    st.integers(-2, 3),
    st.sampled_from(["shift", "none", "rewind", "reuse", "no-token"]),
)
def test_a_parent_record_is_a_writers_only_when_counter_total_revision_and_stamps_agree(
    counter: int,
    total: int,
    revision: int,
    moved: int,
    added: int,
    bumped: int,
    stamping: str,
) -> None:
    old = [token(n) for n in range(PLACES)]
    new = {
        "shift": [token(9), *old[:-1]],
        "none": old,
        "rewind": [*old[1:], ""],
        "reuse": [old[1], *old[:-1]],
        "no-token": ["x", *old[:-1]],
    }[stamping]
    before = parent(counter, total, revision, old)
    after = parent(counter + moved, total + added, revision + bumped, new)
    verdict = stamps.writers_parent_change(
        (before[0], after[0]), (before[1], after[1]), (before[2], after[2]), (before[3], after[3])
    )
    assert verdict == (moved == added and bumped == 1 and stamping == "shift")


def test_a_parent_a_writer_makes_starts_from_nothing() -> None:
    new = (token(1), "", "")
    assert stamps.writers_parent_change(
        (None, Decimal(1)), (None, Decimal(1)), (None, Decimal(1)), (("", "", ""), new)
    )
    assert not stamps.writers_parent_change(
        (None, Decimal(1)), (None, None), (None, Decimal(1)), (("", "", ""), new)
    )
