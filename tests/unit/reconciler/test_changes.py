"""Grouping stream records into per-(rule, parent) changes, and the zero-read balance check."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tally.reconciler.stream.changes import Batch, Group
from tally.reconciler.stream.grouping import group_records
from tally.reconciler.stream.images import TTL_PRINCIPAL
from tally.rules import REPAIR_MARKER, load_rules
from tests.utils import stream_record

RULES = load_rules(Path(__file__).parents[2] / "integration" / "rules.toml")
POST = {"PK": "POST#a91f", "SK": "META"}
ORDER = {"PK": "ORDER#17", "SK": "META"}
PROJECT = {"PK": "PROJECT#p1", "SK": "COUNTER#ISSUE"}
USERS = {"PK": "UserMetadata", "SK": "META"}
TTL = {"type": "Service", "principalId": TTL_PRINCIPAL}


def like(
    user: str, post: str = "POST#a91f", seq: str | None = None, **image: Any
) -> dict[str, Any]:
    return stream_record("INSERT", {"PK": post, "SK": f"LIKE#USER#{user}"}, image, seq=seq)


def unlike(user: str, post: str = "POST#a91f", **kw: Any) -> dict[str, Any]:
    return stream_record("REMOVE", {"PK": post, "SK": f"LIKE#USER#{user}"}, old={}, **kw)


def tally(
    before: Any, after: Any, post: str = "POST#a91f", seq: str | None = None, **image: Any
) -> dict[str, Any]:
    keys = {"PK": post, "SK": "META"}
    return stream_record(
        "MODIFY", keys, {"likeTally": after, **image}, {"likeTally": before, **image}, seq=seq
    )


def counter(attribute: str, keys: dict[str, str], before: Any, after: Any) -> dict[str, Any]:
    return stream_record("MODIFY", keys, {attribute: after}, {attribute: before})


def issue(number: int, project: str = "PROJECT#p1") -> dict[str, Any]:
    return stream_record("INSERT", {"PK": project, "SK": f"ISSUE#{number:010d}"}, {"title": "t"})


def only(batch: Batch) -> Group:
    [group] = batch.groups.values()
    return group


# --- count rules ------------------------------------------------------------------------


def test_a_like_transaction_balances() -> None:
    group = only(group_records([like("1"), tally(0, 1)], RULES))
    assert group.rule.name == "likes" and group.parent_key == POST
    assert (group.counter_delta, group.child_delta) == (1, 1)
    assert group.balanced


def test_a_lone_child_insert_does_not_balance() -> None:
    group = only(group_records([like("1")], RULES))
    assert group.child_delta == 1 and group.counter_delta == 0
    assert not group.balanced


def test_a_lone_counter_change_does_not_balance() -> None:
    group = only(group_records([tally(3, 4)], RULES))
    assert group.counter_delta == 1 and group.child_delta == 0
    assert not group.balanced


def test_an_unlike_balances() -> None:
    group = only(group_records([unlike("1"), tally(1, 0)], RULES))
    assert (group.counter_delta, group.child_delta) == (-1, -1)
    assert group.balanced


def test_deltas_across_records_of_one_parent_add_up() -> None:
    records = [
        like("1"),
        tally(0, 1),
        like("2"),
        tally(1, 2),
        like("3"),
        tally(2, 3),
        unlike("1"),
        tally(3, 2),
    ]
    group = only(group_records(records, RULES))
    assert (group.counter_delta, group.child_delta) == (2, 2)
    assert group.balanced


def test_a_parent_write_without_a_counter_change_adds_nothing() -> None:
    rename = stream_record(
        "MODIFY", POST, {"likeTally": 4, "title": "b"}, {"likeTally": 4, "title": "a"}
    )
    group = only(group_records([rename, like("1"), tally(4, 5)], RULES))
    assert group.balanced
    assert len(group.evidence) == 2  # the rename is not evidence


def test_one_group_per_rule_and_parent() -> None:
    records = [like("1", "POST#a"), tally(0, 1, "POST#a"), like("1", "POST#b"), like("2", "POST#b")]
    batch = group_records(records, RULES)
    by_parent = {g.parent_key["PK"]: g for g in batch.groups.values()}
    assert set(by_parent) == {"POST#a", "POST#b"}
    assert all(g.parent_key["SK"] == "META" for g in by_parent.values())
    assert by_parent["POST#a"].balanced
    assert by_parent["POST#b"].child_delta == 2 and not by_parent["POST#b"].balanced


# --- sum rules --------------------------------------------------------------------------


def line(number: int, before: Any = None, after: Any = None) -> dict[str, Any]:
    keys = {"PK": "ORDER#17", "SK": f"LINE#{number}"}
    if before is None:
        return stream_record("INSERT", keys, {"amount": after})
    return stream_record("MODIFY", keys, {"amount": after}, {"amount": before})


def test_sum_deltas_balance_exactly_in_decimal() -> None:
    records = [
        line(1, after=Decimal("0.1")),
        line(2, after=Decimal("0.2")),
        counter("total", ORDER, Decimal(0), Decimal("0.3")),
    ]
    group = only(group_records(records, RULES))
    assert group.child_delta == Decimal("0.3") == group.counter_delta
    assert group.balanced


def test_sum_deltas_off_by_a_float_rounding_do_not_balance() -> None:
    records = [
        line(1, after=Decimal("0.1")),
        line(2, after=Decimal("0.2")),
        counter("total", ORDER, Decimal(0), Decimal("0.30000000000000004")),
    ]
    assert not only(group_records(records, RULES)).balanced


def test_an_amount_change_balances_against_the_total_delta() -> None:
    records = [
        line(1, Decimal("19.99"), Decimal("5.01")),
        counter("total", ORDER, Decimal("19.99"), Decimal("5.01")),
    ]
    group = only(group_records(records, RULES))
    assert group.child_delta == Decimal("-14.98") == group.counter_delta
    assert group.balanced


def test_a_child_with_a_string_amount_is_invalid() -> None:
    records = [line(1, after="12.50"), counter("total", ORDER, Decimal(0), Decimal("12.50"))]
    group = only(group_records(records, RULES))
    [invalid] = group.invalid
    assert (invalid.attribute, invalid.value) == ("amount", "string of 5 characters")
    assert invalid.key == {"PK": "ORDER#17", "SK": "LINE#1"}
    assert not group.balanced


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("many", "string of 4 characters"),
        (Decimal(-1), Decimal(-1)),
        (Decimal("1.5"), Decimal("1.5")),
    ],
)
def test_a_count_parent_holding_a_non_count_is_invalid(value: Any, shown: Any) -> None:
    group = only(group_records([like("1"), tally(0, value)], RULES))
    [invalid] = group.invalid
    assert (invalid.attribute, invalid.value) == ("likeTally", shown)
    assert invalid.key == POST
    assert not group.balanced


def test_a_fractional_sum_total_is_valid() -> None:
    records = [line(1, after=Decimal("2.5")), counter("total", ORDER, Decimal(0), Decimal("2.5"))]
    group = only(group_records(records, RULES))
    assert group.invalid == []
    assert group.balanced


# --- sequences --------------------------------------------------------------------------


def test_a_counter_advance_with_its_member_inserts_balances() -> None:
    records = [counter("lastIssue", PROJECT, 3, 5), issue(4), issue(5)]
    group = only(group_records(records, RULES))
    assert group.parent_key == PROJECT
    assert group.handed_out == [(4, 5)]
    assert sorted(group.inserted) == [4, 5]
    assert group.counter_seen == 5
    assert group.balanced


def test_a_handed_out_number_without_its_insert_does_not_balance() -> None:
    group = only(group_records([counter("lastIssue", PROJECT, 3, 5), issue(4)], RULES))
    assert not group.balanced


def test_a_counter_going_backwards_is_a_decrease() -> None:
    group = only(group_records([counter("lastIssue", PROJECT, 5, 3)], RULES))
    [evidence] = group.decreases
    assert (evidence.old, evidence.new) == (5, 3)
    assert not group.balanced


def test_a_huge_counter_jump_is_one_range_not_a_set_of_numbers() -> None:
    group = only(group_records([counter("lastIssue", PROJECT, 3, Decimal("1E+125"))], RULES))
    assert group.handed_out == [(4, 10**125)]
    assert group.horizon == 10**125
    assert not group.balanced


def test_ranges_balance_inserts_in_any_order_and_catch_a_repeat() -> None:
    records = [counter("lastIssue", PROJECT, 3, 4), counter("lastIssue", PROJECT, 4, 6)]
    assert only(group_records([*records, issue(6), issue(4), issue(5)], RULES)).balanced
    assert not only(group_records([*records, issue(4), issue(4), issue(5)], RULES)).balanced
    assert not only(group_records([*records, issue(4), issue(5), issue(7)], RULES)).balanced


def test_a_removed_member_does_not_balance() -> None:
    removal = stream_record("REMOVE", {"PK": "PROJECT#p1", "SK": "ISSUE#0000000002"}, old={})
    group = only(group_records([removal], RULES))
    assert group.members_removed == 1
    assert not group.balanced


def user(name: str, sequence: str, number: int) -> dict[str, Any]:
    image = {"seqName": sequence, "NumIdentifier": number, "email": f"{name}@example.com"}
    return stream_record("INSERT", {"PK": f"User#{name}", "SK": "PROFILE"}, image)


def test_an_index_member_is_numbered_from_its_image() -> None:
    records = [counter("LastID", USERS, 6, 7), user("ann", "user-numbers", 7)]
    group = only(group_records(records, RULES))
    assert group.parent_key == USERS
    assert dict(group.inserted) == {7: 1}
    assert group.balanced


def test_an_index_member_of_another_sequence_is_ignored() -> None:
    group = only(group_records([user("bob", "invoice-numbers", 7)], RULES))
    assert not group.inserted
    assert group.evidence == []


# --- own writes and TTL -----------------------------------------------------------------


def test_records_with_a_changed_repair_marker_are_claims_for_the_audit_table() -> None:
    repair = stream_record("MODIFY", POST, {"likeTally": 2, REPAIR_MARKER: "f1"}, {"likeTally": 9})
    again = stream_record(
        "MODIFY", POST, {"likeTally": 3, REPAIR_MARKER: "f2"}, {"likeTally": 2, REPAIR_MARKER: "f1"}
    )
    batch = group_records([repair, again], RULES)
    assert [c.marker for c in batch.claims] == ["f1", "f2"]
    assert batch.own_writes == 0
    assert batch.groups == {}


def test_an_unchanged_repair_marker_is_an_ordinary_write() -> None:
    batch = group_records([like("1"), tally(2, 3, **{REPAIR_MARKER: "f1"})], RULES)
    assert batch.own_writes == 0
    group = only(batch)
    assert group.counter_delta == 1
    assert group.balanced


def test_a_ttl_removal_on_a_decrement_rule_is_an_expiry() -> None:
    keys = {"PK": "USER#u1", "SK": "SESSION#s1"}
    expired = stream_record("REMOVE", keys, old={"expiresAt": 1}, identity=TTL)
    group = only(group_records([expired], RULES))
    assert group.rule.name == "sessions"
    [expiry] = group.expiries
    assert expiry.key == keys and expiry.event_id == expired["eventID"]
    assert expiry.delta == 1  # the amount to take off the counter
    assert group.child_delta == 0
    assert not group.ttl_removed


def test_a_ttl_removal_on_an_alert_rule_counts_as_a_removal() -> None:
    group = only(group_records([unlike("1", identity=TTL)], RULES))
    assert group.ttl_removed
    assert group.child_delta == -1
    assert group.expiries == []
    assert not group.balanced


def test_a_removal_by_anyone_but_dynamodb_is_not_ttl() -> None:
    keys = {"PK": "USER#u1", "SK": "SESSION#s1"}
    someone = {"type": "Service", "principalId": "lambda.amazonaws.com"}
    group = only(group_records([stream_record("REMOVE", keys, old={}, identity=someone)], RULES))
    assert group.expiries == [] and not group.ttl_removed
    assert group.child_delta == -1


# --- robustness and evidence ------------------------------------------------------------


def test_unrelated_keys_are_skipped() -> None:
    batch = group_records([stream_record("INSERT", {"PK": "MISC#1", "SK": "X"}, {"a": 1})], RULES)
    assert (batch.records, batch.skipped) == (1, 1)
    assert batch.groups == {}


def test_malformed_records_are_counted_and_the_rest_still_grouped() -> None:
    no_keys = like("9")
    del no_keys["dynamodb"]["Keys"]
    no_sequence = like("8")
    del no_sequence["dynamodb"]["SequenceNumber"]
    batch = group_records([no_keys, like("1"), no_sequence, tally(0, 1)], RULES)
    assert batch.malformed == [no_keys["eventID"], no_sequence["eventID"]]
    assert batch.records == 4
    assert only(batch).balanced


def test_evidence_carries_keys_and_counter_values_but_no_other_attributes() -> None:
    secret = "ann@example.com"
    records = [like("1", email=secret), tally(0, 1, email=secret)]
    group = only(group_records(records, RULES))
    child, parent = group.evidence
    assert (child.event, child.keys) == ("INSERT", {"PK": "POST#a91f", "SK": "LIKE#USER#1"})
    assert (parent.keys, parent.old, parent.new) == (POST, 0, 1)
    assert parent.sequence_number == records[1]["dynamodb"]["SequenceNumber"]
    assert secret not in repr(group.evidence) and "email" not in repr(group.evidence)
    assert secret not in repr(group)


def test_first_sequence_number_is_the_numerically_smallest() -> None:
    records = [like("1", seq="1000"), tally(0, 1, seq="999"), like("2", seq="10000")]
    group = group_records(records, RULES)
    assert only(group).first_sequence_number == "999"
