"""The writers' stamps (protocol.stamps): when a look may judge a parent that kept moving, the
tokens a child's record shows, and the references a look is sent with. Checked against a
model of a parent's history: the writers' stamped changes, and outsiders' changes."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.stamps import TOKEN, UNKNOWN, key_mark, made_at, removed
from tally.reconciler.protocol import lifecycle, stamps
from tally.reconciler.protocol.stamps import Known
from tally.reconciler.protocol.window import Noted, latest

# A change a parent takes: a writer's (stamped), an outsider's that bumps the revision, or an
# outsider's that leaves it (a rogue ADD to the counter alone); each outsider's moves the
# counter behind the writers' backs.
CHANGES = st.sampled_from(["stamped", "bumped", "quiet"])


def token(second: float, child: str = "dan") -> str:
    """A writer's token (tally.core.stamps), made at ``second`` for a change of ``child``."""
    mark = key_mark({"PK": f"USER#{child}", "SK": "FOLLOWS#ann"})
    return f"{int(second * 1000):011x}{mark}{secrets.token_hex(4)[:7]}"


@dataclass(frozen=True)
class State:
    """A parent after a change: revision, counter, the writers' total, stamps (newest first,
    "" where none yet), and the token the change stamped (None: an outsider's)."""

    revision: int
    counter: int
    total: int
    places: tuple[str, ...]
    made: str | None

    @property
    def reference(self) -> stamps.Reference | None:
        state = lifecycle.state_of(True, Decimal(self.counter), Decimal(self.revision))
        return stamps.reference(stamps.stamped_state(state, self.places[0], Decimal(self.total)))

    @property
    def offset(self) -> Decimal | None:
        return stamps.offset_of(Decimal(self.counter), Decimal(self.total))


def history(changes: list[str], depth: int) -> list[State]:
    """The parent after each change (the first: as created, its counter 3), one change a
    second from second 1000."""
    states = [State(0, 3, 0, ("",) * depth, None)]
    for second, change in enumerate(changes, start=1000):
        last = states[-1]
        if change == "stamped":
            made = token(second)
            places = (made, *last.places[:-1])
            states.append(State(last.revision + 1, last.counter + 1, last.total + 1, places, made))
        else:
            revision = last.revision + (change == "bumped")
            states.append(State(revision, last.counter + 1, last.total, last.places, None))
    return states


def proven(since: State, now: State, known: Known, **options: Any) -> bool:
    assert since.reference is not None
    return stamps.proven(since.reference, now.revision, now.offset, now.places, known, **options)


@settings(max_examples=2000)
@given(st.lists(CHANGES, max_size=30), st.integers(2, 8), st.data())
def test_a_parent_is_proven_exactly_when_each_change_since_its_reference_is_a_stamped_one(
    changes: list[str], depth: int, data: st.DataObject
) -> None:
    states = history(changes, depth)
    start = data.draw(st.integers(0, len(states) - 1))
    end = data.draw(st.integers(start, len(states) - 1))
    since, now = states[start], states[end]
    assert since.reference == stamps.Reference(
        since.revision, since.places[0], Decimal(since.counter - since.total)
    )
    between = changes[start:end]
    taken = [s.made for s in states[start + 1 : end + 1] if s.made is not None]
    every = Known(frozenset(s.made for s in states if s.made is not None))
    expected = set(between) <= {"stamped"} and len(taken) < depth
    assert proven(since, now, every) == expected
    if expected:
        assert since.reference is not None
        found = stamps.taken_since(since.reference, now.revision, now.places)
        assert found == tuple(reversed(taken))
    # Each stamp since the reference must be known: one missing, and nothing is proven,
    # unless it is the newest one and its child is read from the table.
    for missing in taken:
        known = Known(every.tokens - {missing})
        newest = missing == taken[-1]
        assert not proven(since, now, known)
        assert proven(since, now, known, newest_read=True) == (expected and newest)


@settings(max_examples=1000)
@given(st.lists(CHANGES, max_size=30), st.integers(2, 8), st.data())
def test_a_stamp_from_before_the_reference_must_be_known_while_it_is_young(
    changes: list[str], depth: int, data: st.DataObject
) -> None:
    """A shard may lag more than a grace: a change before the reference that the parent
    still holds a stamp of must be in the window, unless it is older than ``young_since``."""
    states = history(changes, depth)
    at = states[data.draw(st.integers(0, len(states) - 1))]
    every = Known(frozenset(s.made for s in states if s.made is not None))
    for missing in [p for p in at.places if p]:
        made = made_at(missing)
        assert made is not None
        known = Known(every.tokens - {missing})
        assert not proven(at, at, known, young_since=made)
        assert proven(at, at, known, young_since=made + 1)
        # A later change of the same child in the window: this one was verified before it.
        later = Known.of([note(token(made + 0.001, "dan"))])  # a millisecond later
        assert proven(at, at, Known(known.tokens, later.latest), young_since=made)
        # Of another child: it tells nothing of this one.
        other = Known.of([note(token(made + 1, "eve"))])
        assert not proven(at, at, Known(known.tokens, other.latest), young_since=made)
    assert proven(at, at, every, young_since=0)


def test_a_reference_whose_newest_stamp_the_parent_holds_twice_proves_nothing() -> None:
    """Two removals of children no writer stamped once left "?" twice: a reference on one
    of them, found one place down, would count an outsider's change as a stamped one."""
    first, second = token(1000), token(1001)
    since = stamps.Reference(4, "?", Decimal(0))
    assert stamps.taken_since(since, 5, ["?", "?", first]) is None
    assert stamps.taken_since(stamps.Reference(4, first, Decimal(0)), 5, [second, first]) == (
        second,
    )
    # With no stamp at the reference, the places below the changes since are the empty ones.
    none = stamps.Reference(4, "", Decimal(0))
    assert stamps.taken_since(none, 5, [first, "", ""]) == (first,)
    assert stamps.taken_since(none, 6, [first, "", ""]) is None


@settings(max_examples=500)
@given(st.lists(CHANGES, max_size=20), st.integers(2, 8))
def test_no_parent_is_proven_at_a_revision_before_its_reference(
    changes: list[str], depth: int
) -> None:
    states = history(changes, depth)
    every = Known(frozenset(s.made for s in states if s.made is not None))
    for earlier in states:
        if earlier.revision < states[-1].revision:
            assert not proven(states[-1], earlier, every)


def note(*tokens: str) -> Noted:
    return Noted({"PK": "USER#x", "SK": "FOLLOWS#ann"}, "1", True, None, 0.0, tokens)


TOKENS = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=30),
    st.binary(min_size=11, max_size=13).map(bytes.hex),
)


@settings(max_examples=1000)
@given(TOKENS, st.booleans(), TOKENS)
def test_a_record_shows_only_writers_tokens_and_a_leaving_child_its_old_one_marked(
    token: object, named: bool, old: object
) -> None:
    shown = stamps.shown_by(token, named, old)
    assert all(TOKEN.fullmatch(t) for t in shown)
    assert UNKNOWN not in shown
    valid = {t for t in (token, old) if isinstance(t, str) and TOKEN.fullmatch(t)}
    if named:
        assert (token in shown) == (token in valid)
    elif old in valid and not str(old).startswith("-"):
        assert f"-{old}" in shown
    assert (old in shown) == (old in valid)


def test_a_removal_of_a_child_no_writer_stamped_is_matched_by_no_record() -> None:
    assert removed(None) is None and removed("") is None
    made = token(1000)
    assert removed(made) == f"-{made}" and removed(f"-{made}") is None
    assert not any(UNKNOWN in stamps.shown_by(None, named, None) for named in (1, 0))


@settings(max_examples=500)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 10**6).map(str),
            st.lists(st.binary(min_size=12, max_size=12).map(bytes.hex)),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_a_childs_notes_in_one_batch_keep_every_token_they_showed(
    records: list[tuple[str, list[str]]],
) -> None:
    key = {"PK": "USER#dan", "SK": "FOLLOWS#ann"}
    notes = [Noted(key, seq, True, None, 0.0, tuple(tokens)) for seq, tokens in records]
    (note,) = latest(notes).values()
    assert set(note.tokens) == {t for _, tokens in records for t in tokens}
    assert int(note.sequence_number) == max(int(seq) for seq, _ in records)


def test_a_stamped_reference_is_a_whole_revision_a_newest_stamp_and_an_offset() -> None:
    # A look knows where a parent stood by its revision: without a whole one, no reference;
    # nor without a counter and a total that are numbers (absent: 0).
    made = token(1000)
    expected = {
        "gone": None,
        "3 7": stamps.Reference(7, "", Decimal(1)),
        "- 7": stamps.Reference(7, "", Decimal(-2)),
        "- -": None,
        "3 -": None,
        "x 7": None,
    }
    for state, since in expected.items():
        assert stamps.reference(state) is None  # not stamped
        assert stamps.reference(stamps.stamped_state(state, None, Decimal(2))) == since
    state = stamps.stamped_state("3 7", made, None)
    assert stamps.reference(state) == stamps.Reference(7, made, Decimal(3))
    assert stamps.reference(stamps.stamped_state("3 7", made, "2")) is None  # a total no number
    assert stamps.reference("3 7 a b c") is None
