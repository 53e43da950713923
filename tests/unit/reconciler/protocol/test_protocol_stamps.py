"""The writers' stamps (protocol.stamps): when a look may judge a parent that kept moving, the
tokens a child's record shows, and the references a look is sent with. Checked against a
model of a parent's history: the writers' stamped changes, and outsiders' changes."""

from __future__ import annotations

import secrets
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.protocol import lifecycle, stamps
from tally.reconciler.protocol.window import Noted, latest

# A change a parent takes: a writer's (stamped), an outsider's that bumps the revision, or an
# outsider's that leaves it (a rogue ADD to the counter alone).
CHANGES = st.sampled_from(["stamped", "bumped", "quiet"])


def token(second: int) -> str:
    return f"{second:09x}{secrets.token_hex(8)[:15]}"


def history(changes: list[str], depth: int) -> list[tuple[int, tuple[str, ...], str | None]]:
    """The parent after each change (the first: as created): its revision, its stamps newest
    first ("" where none yet), and the token each change stamped (None: an outsider's), one
    change a second from second 1000."""
    revision, places = 0, ("",) * depth
    states: list[tuple[int, tuple[str, ...], str | None]] = [(revision, places, None)]
    for second, change in enumerate(changes, start=1000):
        made = None
        if change == "stamped":
            made = token(second)
            places = (made, *places[:-1])
        if change != "quiet":
            revision += 1
        states.append((revision, places, made))
    return states


@settings(max_examples=2000)
@given(st.lists(CHANGES, max_size=30), st.integers(2, 8), st.data())
def test_a_parent_is_proven_exactly_when_each_change_since_its_reference_is_a_stamped_one(
    changes: list[str], depth: int, data: st.DataObject
) -> None:
    states = history(changes, depth)
    start = data.draw(st.integers(0, len(states) - 1))
    end = data.draw(st.integers(start, len(states) - 1))
    revision, places, _ = states[start]
    now_revision, now_places, _ = states[end]
    since = stamps.reference(
        stamps.stamped_state(lifecycle.state_of(True, Decimal(3), Decimal(revision)), places[0])
    )
    assert since == (revision, places[0])
    between = changes[start:end]
    taken = [s[2] for s in states[start + 1 : end + 1] if s[2] is not None]
    every = {s[2] for s in states if s[2] is not None}
    expected = "bumped" not in between and len(taken) < depth
    assert stamps.proven(since, now_revision, now_places, every) == expected
    if expected:
        assert stamps.taken_since(since, now_revision, now_places) == tuple(reversed(taken))
    # Each stamp since the reference must be known: one missing, and nothing is proven,
    # unless it is the newest one and its child is read from the table.
    for missing in taken:
        known = every - {missing}
        newest = missing == taken[-1]
        assert not stamps.proven(since, now_revision, now_places, known)
        assert stamps.proven(since, now_revision, now_places, known, newest_read=True) == (
            expected and newest
        )


@settings(max_examples=1000)
@given(st.lists(CHANGES, max_size=30), st.integers(2, 8), st.data())
def test_a_stamp_from_before_the_reference_must_be_known_while_it_is_young(
    changes: list[str], depth: int, data: st.DataObject
) -> None:
    """A shard may lag more than a grace: a change before the reference that the parent
    still holds a stamp of must be in the window, unless it is older than ``young_since``."""
    states = history(changes, depth)
    start = data.draw(st.integers(0, len(states) - 1))
    revision, places, _ = states[start]
    every = {s[2] for s in states if s[2] is not None}
    since = (revision, places[0])
    held = [p for p in places if p]
    for missing in held:
        made = stamps.made_at(missing)
        assert made is not None
        known = every - {missing}
        assert not stamps.proven(since, revision, places, known, young_since=made)
        assert stamps.proven(since, revision, places, known, young_since=made + 1)
    assert stamps.proven(since, revision, places, every, young_since=0)


@settings(max_examples=500)
@given(st.lists(CHANGES, max_size=20), st.integers(2, 8))
def test_no_parent_is_proven_at_a_revision_before_its_reference(
    changes: list[str], depth: int
) -> None:
    states = history(changes, depth)
    revision, places, _ = states[-1]
    every = {s[2] for s in states if s[2] is not None}
    for earlier, earlier_places, _ in states:
        if earlier < revision:
            assert not stamps.proven((revision, places[0]), earlier, earlier_places, every)


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
    assert all(stamps.TOKEN.fullmatch(t) for t in shown)
    assert stamps.UNKNOWN not in shown
    valid = {t for t in (token, old) if isinstance(t, str) and stamps.TOKEN.fullmatch(t)}
    if named:
        assert (token in shown) == (token in valid)
    elif old in valid and not str(old).startswith("-"):
        assert f"-{old}" in shown
    assert (old in shown) == (old in valid)


def test_a_removal_of_a_child_no_writer_stamped_is_matched_by_no_record() -> None:
    assert stamps.removed(None) == stamps.UNKNOWN
    assert stamps.removed("") == stamps.UNKNOWN
    assert not any(stamps.UNKNOWN in stamps.shown_by(None, named, None) for named in (1, 0))


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


def test_a_stamped_reference_is_a_whole_revision_and_a_newest_stamp() -> None:
    # A look knows where a parent stood by its revision: without a whole one, no reference.
    expected = {"gone": None, "3 7": (7, ""), "- -": None, "3 -": None, "x 7": (7, "")}
    for state, since in expected.items():
        assert stamps.reference(state) is None  # not stamped
        assert stamps.reference(stamps.stamped_state(state, None)) == since
    made = token(1000)
    assert stamps.reference(stamps.stamped_state("3 7", made)) == (7, made)
    assert stamps.reference("3 7 a b") is None
