"""`tally rules suggest`: proposals read off sampled items, rendered as a rules file."""

from __future__ import annotations

import random
import tomllib
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import boto3
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from moto import mock_aws

from tally.cli.rules_suggest import Proposal, Shape, compatible, document, render, suggest
from tally.core.dynamodb import serialize
from tally.local.template import create_table_from
from tally.rules import RuleSet, TableKeys, parse_rules
from tally.rules.live_table import TableShape

PK_SK = TableKeys(partition_key="PK", sort_key="SK")
NUMBERED = TableKeys(partition_key="pk", sort_key="sk", sort_key_type="N")


def shape(keys: TableKeys, name: str = "t") -> TableShape:
    return TableShape(name, keys, "NEW_AND_OLD_IMAGES", frozenset())


def proposed(keys: TableKeys, items: list[dict[str, Any]], limit: int = 1000) -> RuleSet:
    proposals = suggest(None, shape(keys), items, limit)
    text = render("t", len(items), keys, proposals)
    return parse_rules(tomllib.loads(text))


def rule(rules: RuleSet) -> dict[str, Any]:
    [only] = list(rules)
    return only.model_dump(
        exclude_none=True, exclude={"name", "repair", "grace_seconds", "orphan_grace_seconds"}
    )


def posts(n: int, seed: int = 1, drifted: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    items = []
    for p in range(n):
        likes = rng.randrange(1, 6)
        tally = likes + (1 if p < drifted else 0)
        # The revision counts every write: likes and unlikes alike.
        items.append(
            {
                "PK": f"POST#{p:03d}",
                "SK": "META",
                "likeTally": Decimal(tally),
                "tallyRevision": Decimal(likes + rng.randrange(0, 3) * 2),
            }
        )
        items += [
            {"PK": f"POST#{p:03d}", "SK": f"LIKE#USER#{u:02d}", "likedAt": Decimal(1750636800 + u)}
            for u in range(likes)
        ]
    return items


def test_a_count_is_proposed_from_parents_that_match_their_children() -> None:
    assert rule(proposed(PK_SK, posts(20))) == {
        "kind": "count",
        "parent": {"PK": "POST#*", "SK": "META"},
        "children": {"SK": "LIKE#*"},
        "counter": "likeTally",
        "on_ttl_expiry": "alert",
    }


def test_a_few_drifted_parents_do_not_hide_the_rule_and_are_counted() -> None:
    items = posts(20, drifted=2)
    proposals = suggest(None, shape(PK_SK), items, 1000)
    assert [(p.shape.counter, p.held, len(p.parents)) for p in proposals] == [("likeTally", 18, 20)]
    assert "for 18 of 20 parents" in render("t", len(items), PK_SK, proposals)


def test_a_sum_over_one_attribute_is_proposed() -> None:
    items = []
    for o in range(10):
        amounts = [Decimal(a) for a in range(1, o % 4 + 2)]
        items.append({"PK": f"ORDER#{o}", "SK": "META", "total": sum(amounts)})
        items += [
            {"PK": f"ORDER#{o}", "SK": f"LINE#{i}", "amount": a, "qty": Decimal(1)}
            for i, a in enumerate(amounts)
        ]
    found = rule(proposed(PK_SK, items))
    assert (found["kind"], found["summed"], found["children"]) == (
        "sum",
        "amount",
        {"SK": "LINE#*"},
    )


def test_a_padded_sequence_in_a_collection_is_proposed_with_its_width() -> None:
    items = []
    for p in range(8):
        last = p + 3
        items.append({"PK": f"PROJECT#{p}", "SK": "COUNTER#ISSUE", "lastIssue": Decimal(last)})
        items += [{"PK": f"PROJECT#{p}", "SK": f"ISSUE#{n:06d}"} for n in range(1, last + 1)]
    found = rule(proposed(PK_SK, items))
    assert found["kind"] == "sequence" and found["counter"] == "lastIssue"
    assert found["members"] == {"layout": "collection", "key": {"SK": "ISSUE#*"}, "width": 6}


def test_a_sequence_on_a_number_sort_key() -> None:
    items = []
    for p in "ABCDE":
        items.append({"pk": f"project{p}", "sk": Decimal(0), "lastIssue": Decimal(4)})
        items += [{"pk": f"project{p}", "sk": Decimal(n), "priority": "low"} for n in (1, 2, 4)]
    found = rule(proposed(NUMBERED, items))
    assert found["parent"] == {"pk": "project*", "sk": "0"}
    assert found["members"] == {"layout": "collection", "key": {"sk": "*"}, "width": 10}


def test_the_last_collection_of_a_full_sample_is_left_out() -> None:
    cut = posts(5)[:-1]  # the scan stopped inside the last post: one of its likes is missing
    proposals = suggest(None, shape(PK_SK), cut, len(cut))
    assert [len(p.parents) for p in proposals] == [4]


def test_nothing_numeric_proposes_nothing() -> None:
    items = [{"PK": f"USER#{n}", "SK": "PROFILE", "name": "x"} for n in range(5)]
    assert suggest(None, shape(PK_SK), items, 100) == []


@pytest.fixture
def orders() -> Iterator[Any]:
    with mock_aws():
        ddb = boto3.client("dynamodb")
        create_table_from(
            ddb,
            {
                "TableName": "orders",
                "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
                "BillingMode": "PAY_PER_REQUEST",
            },
            None,
        )
        yield ddb


def test_a_counter_over_partitions_is_confirmed_by_two_reads(orders: Any) -> None:
    items: list[dict[str, Any]] = [{"pk": "orderCounter", "count": Decimal(40)}]
    items += [{"pk": str(n), "total": Decimal(n % 7)} for n in range(1, 41)]
    for item in items:
        orders.put_item(TableName="orders", Item=serialize(item))
    keys = TableKeys(partition_key="pk")
    sampled = [i for i in items if i["pk"] not in ("40", "39")]  # the sample misses the top
    proposals = suggest(orders, shape(keys, "orders"), sampled, 1000)
    text = render("orders", len(sampled), keys, proposals)
    found = rule(parse_rules(tomllib.loads(text)))
    assert found["parent"] == {"pk": "orderCounter"}
    assert found["members"] == {"layout": "partition", "key": {"pk": "*"}, "width": 1}
    # A counter one past the highest order is no sequence of these orders.
    sampled[0]["count"] = Decimal(41)
    assert suggest(orders, shape(keys, "orders"), sampled, 1000) == []


collections = st.lists(
    st.tuples(
        st.sampled_from(["POST#", "ORDER#", "x"]),
        st.lists(
            st.tuples(
                st.sampled_from(["LIKE#", "LINE#", "META", "A#B#", "7"]),
                st.integers(0, 30),
                st.one_of(st.none(), st.integers(-3, 5)),
            ),
            max_size=6,
        ),
    ),
    max_size=6,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(tables=collections)
def test_whatever_the_items_the_proposals_load_as_a_rules_file(tables: Any) -> None:
    items = []
    for c, (prefix, members) in enumerate(tables):
        for m, (sk, suffix, number) in enumerate(members):
            item: dict[str, Any] = {"PK": f"{prefix}{c}", "SK": f"{sk}{suffix}{m}"}
            if number is not None:
                item["n"] = Decimal(number)
            items.append(item)
    items = list({(i["PK"], i["SK"]): i for i in items}.values())
    proposals = suggest(None, shape(PK_SK), items, 1000)
    if proposals:
        rules = parse_rules(tomllib.loads(render("t", len(items), PK_SK, proposals)))
        assert len(list(rules)) == len(proposals)


def test_an_emoji_in_a_prefix_and_an_attribute_name_loads_back_as_it_was_read() -> None:
    items: list[dict[str, Any]] = []
    for p in range(10):
        likes = p % 3 + 1
        items.append({"PK": f"POST#{p}", "SK": "META", "😀Tally": Decimal(likes)})
        items += [{"PK": f"POST#{p}", "SK": f"LIKE#😀#USER#{u}"} for u in range(likes)]
        items += [{"PK": f"POST#{p}", "SK": f"LIKE#👍#USER#{u}"} for u in range(2)]
    proposals = suggest(None, shape(PK_SK), items, 1000)
    raw = tomllib.loads(render("t", len(items), PK_SK, proposals))
    assert raw == document(PK_SK, proposals)
    assert rule(parse_rules(raw)) == {
        "kind": "count",
        "parent": {"PK": "POST#*", "SK": "META"},
        "children": {"SK": "LIKE#😀#*"},
        "counter": "😀Tally",
        "on_ttl_expiry": "alert",
    }


# What DynamoDB stores in a name or a string key: any Unicode scalar value (UTF-8); a key
# value in a rules file holds no '*' but at its end (a prefix).
names = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12)
key_texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="*"), max_size=12)
key_numbers = st.integers(0, 10**6).map(str)
parent_numbers = st.integers(-(10**6), 0).map(str)  # a parent is no child: no positive number


@st.composite
def tables_and_proposals(draw: st.DrawFn) -> tuple[TableKeys, list[Proposal]]:
    sort_key = draw(st.none() | names)
    keys = TableKeys(
        partition_key=draw(names.filter(lambda name: name != sort_key)),
        sort_key=sort_key,
        partition_key_type=draw(st.sampled_from(["S", "N"])),
        **({} if sort_key is None else {"sort_key_type": draw(st.sampled_from(["S", "N"]))}),
    )

    def values(attribute: str) -> st.SearchStrategy[str]:
        return key_numbers if keys.numeric(attribute) else key_texts.filter(bool)

    proposals = []
    for _ in range(draw(st.integers(1, 3))):
        if sort_key is None:  # suggest's one layout there: members keyed by their number
            kind, numbered, parent_sk = "sequence", keys.partition_key, None
        else:
            kind = draw(st.sampled_from(["count", "sum", "sequence"]))
            numbered = sort_key
            parent_sk = draw(parent_numbers if keys.numeric(sort_key) else values(sort_key))
        span = "" if keys.numeric(numbered) else draw(key_texts)
        summed = draw(names) if kind == "sum" else None
        shape_ = Shape(kind, parent_sk, draw(names), span, kind == "sequence", summed)
        parents = draw(st.lists(values(keys.partition_key), min_size=1, max_size=4))
        widths = draw(st.lists(st.integers(0, 10**4).map(lambda n: str(n).zfill(3)), max_size=3))
        proposals.append(Proposal(shape_, parents, len(parents), widths, sort_key is None))
    return keys, proposals


@settings(max_examples=300, suppress_health_check=[HealthCheck.filter_too_much])
@given(drawn=tables_and_proposals())
def test_every_suggested_file_loads_back_as_the_rules_it_was_made_from(drawn: Any) -> None:
    keys, drawn_proposals = drawn
    proposals = compatible(keys, drawn_proposals)  # what suggest keeps: a valid rules file
    assume(proposals)
    raw = tomllib.loads(render("t", 1000, keys, proposals))
    assert raw == document(keys, proposals)
    loaded, made = parse_rules(raw), parse_rules(document(keys, proposals))
    assert (loaded.table, loaded.rules) == (made.table, made.rules)
