"""Replication links into a Global Table's Region (docs/global-tables.md, "Heartbeats"): the
heartbeat an item image is, the links a settled finding cannot wait out, and the links heard
from a stream batch and held against in the home Region."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tally.core.regions import BEAT_AT, ORIGIN, heartbeat, heartbeat_key
from tally.reconciler.checks.links import ReplicationLinks
from tally.reconciler.protocol.regions import GlobalMode, Link, links_behind
from tally.reconciler.stats import StatsBook
from tests.utils import serialize

US, EU, AP = "us-east-1", "eu-west-1", "ap-southeast-2"
times = st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False, allow_infinity=False)


@given(
    st.dictionaries(st.sampled_from([EU, AP, "xx-nowhere-1"]), times),
    st.dictionaries(st.sampled_from([EU, AP]), st.tuples(times, times)),
    times,
    st.integers(1, 900),
    st.integers(1, 3600),
)
def test_a_link_is_behind_unheard_stalled_or_slow_and_otherwise_trusted(
    beats: dict[str, Decimal],
    measured: dict[str, tuple[Decimal, Decimal]],
    now: Decimal,
    settle: int,
    beat: int,
) -> None:
    heard = {s: Link(s, at, arrived) for s, (at, arrived) in measured.items()}
    behind = {b.source: b for b in links_behind((EU, AP), beats, heard, now, settle, beat)}
    assert set(behind) <= {EU, AP}  # a Region that is not a source is never judged
    for source in (EU, AP):
        if source not in beats:
            assert behind[source].why == "unheard"
        elif now - beats[source] > settle + 2 * beat:
            assert (behind[source].why, behind[source].age) == ("stalled", now - beats[source])
        elif source in heard and heard[source].arrived_at - heard[source].beat_at > settle:
            assert (behind[source].why, behind[source].lag) == ("slow", heard[source].lag)
        else:
            assert source not in behind
        if source in behind:
            assert source in behind[source].describe()


@given(times, times)
def test_a_links_lag_is_never_negative_whatever_the_clocks_say(
    at: Decimal, arrived: Decimal
) -> None:
    link = Link(EU, at, arrived)
    assert link.lag == max(Decimal(0), arrived - at)


@given(
    st.one_of(st.none(), st.text(max_size=5), st.integers()),
    st.one_of(st.none(), times, st.text(max_size=3), st.just(Decimal("NaN"))),
)
def test_an_image_is_a_heartbeat_only_with_a_region_and_a_finite_time(origin: Any, at: Any) -> None:
    image = {"PK": "x"} | ({ORIGIN: origin} if origin is not None else {})
    image |= {BEAT_AT: at} if at is not None else {}
    expected = (
        (origin, at)
        if isinstance(origin, str) and isinstance(at, Decimal) and at.is_finite()
        else None
    )
    assert heartbeat(image) == expected


def test_the_heartbeat_key_follows_the_tables_key_schema() -> None:
    assert heartbeat_key("PK", "SK", EU) == {
        "PK": "tally#heartbeat#eu-west-1",
        "SK": "tally#heartbeat",
    }
    assert heartbeat_key("id", None, EU) == {"id": "tally#heartbeat#eu-west-1"}


class FakeLinks:
    """The audit table's links part, in memory, moving forward only as the real one does."""

    def __init__(self) -> None:
        self.held: dict[str, Link] = {}
        self.reads = 0

    def heard(self, source: str, beat_at: Decimal, arrived_at: Decimal) -> bool:
        if source in self.held and self.held[source].beat_at >= beat_at:
            return False
        self.held[source] = Link(source, beat_at, arrived_at)
        return True

    def links(self, sources: tuple[str, ...]) -> dict[str, Link]:
        self.reads += 1
        return {s: link for s, link in self.held.items() if s in sources}


class FakeBeats:
    """The table's heartbeat items as a replica holds them."""

    def __init__(self) -> None:
        self.held: dict[str, Decimal] = {}
        self.reads = 0

    def newest(self, regions: tuple[str, ...]) -> dict[str, Decimal]:
        self.reads += 1
        return {r: at for r, at in self.held.items() if r in regions}


class FakeReporter:
    def __init__(self) -> None:
        self.alerted: list[Any] = []
        self.cleared: list[tuple[str, dict[str, str]]] = []

    def alert_unrepaired(self, finding: Any) -> None:
        self.alerted.append(finding)

    def clear_standing(self, rule: str, key: dict[str, str]) -> None:
        self.cleared.append((rule, key))


def _record(origin: str, at: str, arrived: int | None = None, **extra: Any) -> dict[str, Any]:
    stream: dict[str, Any] = {
        "Keys": serialize(heartbeat_key("PK", "SK", origin)),
        "NewImage": serialize(
            {**heartbeat_key("PK", "SK", origin), ORIGIN: origin, BEAT_AT: Decimal(at)} | extra
        ),
    }
    if arrived is not None:
        stream["ApproximateCreationDateTime"] = arrived
    return {"eventName": "MODIFY", "dynamodb": stream}


def _links(
    now: float | list[float], strong: bool = False
) -> tuple[ReplicationLinks, FakeBeats, FakeLinks, FakeReporter, StatsBook]:
    clock = now if isinstance(now, list) else [now]
    mode = GlobalMode(US, (US, EU, AP), US, 20, strong=strong, heartbeat_seconds=4)
    beats, store, reporter, book = FakeBeats(), FakeLinks(), FakeReporter(), StatsBook()
    links = ReplicationLinks(
        mode,
        beats,  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        reporter,  # type: ignore[arg-type]
        book,
        "t",
        clock=lambda: clock[0],
    )
    return links, beats, store, reporter, book


def test_heartbeats_of_other_regions_are_heard_with_their_lag_and_nothing_else_is() -> None:
    links, _, store, _, book = _links(1000.0)
    records = [
        _record(EU, "990.5", arrived=992),
        _record(US, "999", arrived=999),  # its own: no link
        _record("xx-nowhere-1", "999", arrived=999),  # not a Region of the table
        {"eventName": "INSERT", "dynamodb": {"NewImage": {BEAT_AT: {"S": "garbage"}}}},
        {"eventName": "INSERT"},
        _record(AP, "995"),  # no arrival time: now
        _record(EU, "980", arrived=999),  # older than the one heard: no move back
    ]
    assert links.hear(records) == 2
    assert store.held == {
        EU: Link(EU, Decimal("990.5"), Decimal(992)),
        AP: Link(AP, Decimal(995), Decimal(1000)),
    }
    assert sorted(book.total.replication_lags) == [(AP, 5.0), (EU, 1.5)]


def test_the_home_region_holds_while_a_link_is_stalled_and_alerts_it_once_per_stall() -> None:
    clock = [1000.0]
    links, beats, _, reporter, book = _links(clock)
    beats.held = {EU: Decimal(990), AP: Decimal(900)}  # ap-southeast-2: 100 s, over 20 + 2 x 4
    held = links.held()
    assert held is not None and "replication from ap-southeast-2 stalled" in held
    assert "eu-west-1" not in held
    assert links.held() == held and beats.reads == 1  # judged once a heartbeat interval
    assert [(f.kind, f.key, f.severity) for f in reporter.alerted] == [
        ("replication_stalled", {"source": AP, "region": US}, "warning")
    ]  # once per invocation; across them, the standing slot keeps it to one per stall
    assert book.total.held == 2
    assert reporter.cleared == [("replication", {"source": EU, "region": US})]  # live: news
    # The beat moved on in the replica (a late invocation): the same link, the same finding.
    beats.held[AP] = Decimal(950)
    clock[0] = 1005.0
    assert links.held() is not None and beats.reads == 2
    stalled = _links([1005.0])
    stalled[1].held = dict(beats.held)
    stalled[0].held()
    assert stalled[3].alerted[0].finding_id == reporter.alerted[0].finding_id
    # The link delivers again: trusted once more, and its standing cleared (a later stall
    # is a new alert).
    beats.held[AP] = Decimal(1004)
    clock[0] = 1010.0
    assert links.held() is None
    assert ("replication", {"source": AP, "region": US}) in reporter.cleared


def test_one_missed_heartbeat_is_no_stall() -> None:
    links, beats, _, reporter, _ = _links([1000.0])
    beats.held = {EU: Decimal(1000 - 20 - 4 - 3), AP: Decimal(999)}  # one beat late, and more
    assert links.held() is None and reporter.alerted == []


def test_a_link_slower_than_the_window_holds_without_an_alert_and_none_heard_alerts() -> None:
    links, beats, store, reporter, _ = _links(1000.0)
    beats.held = {EU: Decimal(995), AP: Decimal(996)}
    store.held = {EU: Link(EU, Decimal(970), Decimal(995))}  # 25 s on its way: over 20
    held = links.held()
    assert held is not None and "replication from eu-west-1 lags 25.0 s" in held
    assert reporter.alerted == []  # slow is no stall: held, not alerted
    unheard, beats, _, reporter, _ = _links(1000.0)
    beats.held = {EU: Decimal(999)}
    assert "no heartbeat from ap-southeast-2" in (unheard.held() or "")
    assert [(f.key["source"], f.stored) for f in reporter.alerted] == [(AP, None)]


def test_no_link_holds_on_a_strongly_consistent_table() -> None:
    links, beats, _, reporter, _ = _links(1000.0, strong=True)
    assert links.held() is None and beats.reads == 0 and reporter.alerted == []
