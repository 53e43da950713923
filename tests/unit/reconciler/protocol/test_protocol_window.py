"""The stream's window (protocol.window): which note of a child counts, what a look counts
from the index and what from the notes, and how far behind the index is."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.reconciler.protocol.window import Noted, index_behind, key_id, latest, split

CHILDREN = [{"PK": f"USER#{n}", "SK": "FOLLOWS#ann"} for n in ("dan", "eve", "fay", "gus")]
notes = st.builds(
    Noted,
    st.sampled_from(CHILDREN),
    st.integers(1, 10**40).map(str),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.decimals(-100, 100, places=2)),
    st.floats(0, 1000),
)
hits = st.dictionaries(
    st.sampled_from(CHILDREN).map(key_id), st.one_of(st.none(), st.decimals(-100, 100, places=2))
)


@settings(max_examples=1000)
@given(st.lists(notes, max_size=12))
def test_the_latest_note_of_a_child_is_the_one_of_its_highest_sequence_number(
    noted: list[Noted],
) -> None:
    found = latest(noted)
    assert set(found) == {key_id(n.key) for n in noted}
    for id_, note in found.items():
        assert all(
            int(n.sequence_number) <= int(note.sequence_number)
            for n in noted
            if key_id(n.key) == id_
        )
    assert latest(reversed(noted)).keys() == found.keys()


@settings(max_examples=1000)
@given(hits, st.lists(notes, max_size=12))
def test_a_look_counts_every_child_once_the_noted_ones_by_their_note(
    shown: dict[tuple[tuple[str, str], ...], Decimal | None], noted: list[Noted]
) -> None:
    by_child = latest(noted)
    indexed, fresh = split(shown, by_child)
    assert fresh == list(by_child.values())
    assert len(indexed) == len(set(shown) - set(by_child))


@settings(max_examples=1000)
@given(hits, st.lists(notes, max_size=12), st.floats(1000, 2000))
def test_the_index_is_behind_by_the_age_of_a_noted_change_it_does_not_show(
    shown: dict[tuple[tuple[str, str], ...], Decimal | None], noted: list[Noted], now: float
) -> None:
    """Whatever the index lists: it is not behind when it lists every noted child it should
    (and no other), with the noted amount; otherwise it is behind by the age of one noted
    change it does not show, and by no less than any such change's age."""
    by_child = latest(noted)
    behind = index_behind(shown, by_child, now)
    assert behind >= 0
    # The index as the notes say it should be: nothing behind.
    caught_up = dict(shown)
    for id_, note in by_child.items():
        if note.counted:
            caught_up[id_] = note.amount if note.amount is not None else shown.get(id_)
        elif note.counted is False:
            caught_up.pop(id_, None)
    assert index_behind(caught_up, by_child, now) == 0
    # Any dated noted change the index does not show makes it at least that old.
    for id_, note in by_child.items():
        differs = (id_ in shown) != (id_ in caught_up) or shown.get(id_) != caught_up.get(id_)
        if differs and note.at:
            assert behind >= now - note.at
    assert behind == 0 or any(behind == now - n.at for n in by_child.values())


def test_an_index_that_shows_every_noted_change_is_not_behind() -> None:
    dan, eve = CHILDREN[:2]
    noted = latest([Noted(dan, "5", True, None, 900.0), Noted(eve, "6", False, None, 950.0)])
    assert index_behind({key_id(dan): None}, noted, 1000.0) == 0
    # eve's removal not shown yet: 50 s behind at least; dan's follow not shown: 100 s.
    assert index_behind({key_id(dan): None, key_id(eve): None}, noted, 1000.0) == 50.0
    assert index_behind({key_id(eve): None}, noted, 1000.0) == 100.0
    amounts = latest([Noted(dan, "5", True, Decimal("2.50"), 990.0)])
    assert index_behind({key_id(dan): Decimal("2.50")}, amounts, 1000.0) == 0
    assert index_behind({key_id(dan): Decimal(2)}, amounts, 1000.0) == 10.0
