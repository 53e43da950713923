"""`tally invoke`'s summary, read from the EMF metrics and JSON log lines a handler prints."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tally.local.invocation import read, summary
from tally.local.recheck_schedule import Scheduled

NOW = 1_795_680_000.0  # 2026-11-26 08:00:00 UTC


def emf(**values: float) -> str:
    """One EMF document as Powertools prints it."""
    metrics = [{"Name": name, "Unit": "Count"} for name in values]
    directive = {"Namespace": "TallyReconciler", "Dimensions": [["service"]], "Metrics": metrics}
    document: dict[str, Any] = {"_aws": {"Timestamp": 0, "CloudWatchMetrics": [directive]}}
    return json.dumps(document | {"service": "tally"} | {k: [v] for k, v in values.items()})


def stream_metrics(**changed: float) -> str:
    names = [
        "RecordsSeen",
        "RecordsSkipped",
        "OwnWrites",
        "MalformedRecords",
        "GroupsBalanced",
        "GroupsCarried",
        "ParentsChecked",
        "Recounts",
        "Deferred",
        "RechecksScheduled",
        "AlertsPublished",
    ]
    return emf(**({name: 0.0 for name in names} | changed))


def test_records_skipped_say_why() -> None:
    seen = read([stream_metrics(RecordsSeen=4, MalformedRecords=1, RecordsSkipped=2)])
    lines = summary(seen, [], [], NOW)
    assert lines[0] == (
        "records: 4 seen, skipped: 1 malformed (no readable keys or images), 2 covered by no rule"
    )


def test_a_finding_and_its_alert_are_named_and_nothing_alerted_is_not_said() -> None:
    finding = {"level": "WARNING", "message": "finding", "kind": "drift", "rule": "likes"}
    finding |= {"key": {"PK": "POST#a91f", "SK": "META"}, "repair": "applied"}
    seen = read([stream_metrics(RecordsSeen=1, ParentsChecked=1, Recounts=1), json.dumps(finding)])
    lines = summary(seen, [], ["drift likes POST#a91f/META stored 100 actual 3"], NOW)
    assert lines == [
        "records: 1 seen, none skipped",
        "groups: 0 balanced (no read), 0 carried to a later batch, 1 parent checked (1 recount)",
        "finding: drift of likes at PK=POST#a91f,SK=META, repair applied",
        "alerted: drift likes POST#a91f/META stored 100 actual 3",
    ]


def test_a_recheck_says_when_it_comes_due_and_nothing_is_alerted_yet() -> None:
    seen = read([stream_metrics(RecordsSeen=2, RechecksScheduled=1)])
    recheck = Scheduled(NOW + 30, 30, "issue-numbers", "PROJECT#A/COUNTER#ISSUE", "unbalanced")
    lines = summary(seen, [recheck], [], NOW)
    assert lines[-2] == (
        "recheck scheduled: unbalanced of issue-numbers PROJECT#A/COUNTER#ISSUE, due "
        "08:00:30 UTC (in 30 s): `tally pump --until-settled` delivers it"
    )
    assert lines[-1] == "nothing alerted yet: the recheck decides"


def test_records_no_rule_covers_are_said_so() -> None:
    seen = read([stream_metrics(RecordsSeen=2, RecordsSkipped=2)])
    assert summary(seen, [], [], NOW)[-1] == (
        "nothing alerted: no record of the event is a counter or child any rule covers"
    )


def test_a_balanced_batch_that_checked_a_parent_says_the_table_agrees() -> None:
    seen = read([stream_metrics(RecordsSeen=2, GroupsBalanced=1, ParentsChecked=1)])
    assert summary(seen, [], [], NOW)[-1].startswith(
        "nothing alerted: the counters checked agree with the table as it is now"
    )


def test_metrics_of_several_documents_add_up_and_other_lines_are_left_out() -> None:
    lines = [
        "not json",
        "[1, 2]",
        emf(ColdStart=1),
        stream_metrics(RecordsSeen=2),
        stream_metrics(RecordsSeen=3),
    ]
    seen = read(lines)
    assert seen.metrics["RecordsSeen"] == 5 and seen.metrics["ColdStart"] == 1


def test_a_function_that_verifies_nothing_says_nothing_about_alerts() -> None:
    seen = read([emf(Writes_created=1)])
    assert summary(seen, [], [], NOW) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@given(st.lists(st.text(max_size=40) | json_values.map(json.dumps), max_size=5))
def test_any_line_is_read_without_an_error(lines: list[str]) -> None:
    summary(read(lines), [], [], NOW)


@given(
    st.dictionaries(
        st.sampled_from(["_aws", "message", "level", "kind", "key", "RecordsSeen"]), json_values
    )
)
def test_any_document_is_read_without_an_error(document: dict[str, Any]) -> None:
    summary(read([json.dumps(document)]), [], [], NOW)


def test_the_recheck_function_counts_parents_not_stream_records() -> None:
    seen = read([stream_metrics(ParentsChecked=1, Recounts=1)])
    assert summary(seen, [], [], NOW, stream=False) == [
        "parents checked: 1 (1 recount)",
        "nothing alerted: what it checked agrees with the table as it is now "
        "(an item it does not hold finds nothing)",
    ]
