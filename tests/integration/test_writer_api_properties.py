"""Generated requests through the writer API's real handler on DynamoDB Local.

Whatever the body, the API answers below 500; afterwards the full audit finds nothing: no
refused request left half a write, and every accepted one kept its counter exact.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.handlers import writer_api
from tally.reconciler import runtime
from tally.reconciler.full_audit import full_audit
from tally.rules import REPAIR_MARKER
from tally.writers.allocations import STRATEGIES
from tests.harness.http import invoke
from tests.integration.conftest import Stack

PARENTS = [
    *({"PK": f"POST#p{n}", "SK": "META", "likeTally": 0} for n in range(3)),
    *({"PK": f"ORDER#o{n}", "SK": "META", "total": 0} for n in range(2)),
    {"PK": "TEAM#t0", "SK": "META", "memberCount": 0},
]
PROJECT = {"PK": "PROJECT#a", "SK": "COUNTER#ISSUE"}
USERS = {"PK": "UserMetadata", "SK": "META"}

EXTREMES = [
    Decimal("NaN"),
    Decimal("Infinity"),
    Decimal("-Infinity"),
    Decimal("1E+400"),
    Decimal("1E-131"),
    Decimal("1E+38"),
    Decimal("5E+37"),
    Decimal("1" * 39),
    Decimal("0.1" + "0" * 40 + "1"),
    Decimal("-0.0"),
]
numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(Decimal),
    st.decimals(min_value=-1000, max_value=1000, places=2),
    st.sampled_from(EXTREMES),
)
RESERVED = ["likeTally", "tallyRevision", "total", "lastIssue", "expiresAt", "seqName"]
names = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["", "amount", "by", "NumIdentifier", "PK", "SK", REPAIR_MARKER, *RESERVED]),
    st.just("n" * 70_000),
)
values = st.recursive(
    st.none() | st.booleans() | st.text(max_size=12) | numbers,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)
attributes = st.one_of(
    st.fixed_dictionaries({"amount": numbers}, optional={"note": st.text(max_size=8)}),
    st.fixed_dictionaries({}, optional={"amount": numbers, "by": st.text(max_size=8)}),
    st.dictionaries(names, values, max_size=4),
    st.just({"big": "x" * 410_000}),
    st.just({"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}),
)
likes = st.builds(
    lambda p, u: {"PK": f"POST#p{p}", "SK": f"LIKE#u{u}"}, st.integers(0, 3), st.integers(0, 4)
)
lines = st.builds(
    lambda o, n: {"PK": f"ORDER#o{o}", "SK": f"LINE#l{n}"}, st.integers(0, 2), st.integers(0, 3)
)
members = st.builds(lambda m: {"PK": "TEAM#t0", "SK": f"MEMBER#m{m}"}, st.integers(0, 3))
users = st.builds(lambda n: {"PK": f"User#n{n}", "SK": "PROFILE"}, st.integers(0, 4))
child_keys = st.one_of(
    likes,
    lines,
    members,
    lines,
    st.sampled_from(
        [
            {"PK": "POST#p0", "SK": "COMMENT#1"},
            {"PK": "POST#p0"},
            {"PK": "POST#p0", "SK": "LIKE#u0", "X": "y"},
            {"PK": "POST#" + "p" * 2100, "SK": "LIKE#u0"},
            {"PK": "POST#p0", "SK": "LIKE#" + "u" * 1100},
        ]
    ),
    st.dictionaries(st.sampled_from(["PK", "SK", ""]), values, max_size=3),
)
amounts = st.one_of(st.decimals(min_value=-1000, max_value=1000, places=2), numbers)
allocations = st.one_of(
    st.fixed_dictionaries(
        {"counter": st.just({"PK": PROJECT["PK"], "SK": PROJECT["SK"]})},
        optional={
            "strategy": st.sampled_from([*STRATEGIES, "fast"]),
            "count": st.one_of(st.integers(-1, 100).map(Decimal), st.just("5"), numbers),
            "attributes": attributes,
        },
    ),
    # Natural keys through gapless only: an atomic repeat burns a number, a gap by design.
    st.fixed_dictionaries(
        {
            "counter": st.just(USERS),
            "member_key": st.builds(
                lambda n: {"PK": f"User#n{n}", "SK": "PROFILE"}, st.integers(0, 4)
            ),
        },
        optional={"attributes": attributes},
    ),
    st.fixed_dictionaries({"counter": child_keys}, optional={"member_key": child_keys}),
)
children = st.fixed_dictionaries({"key": child_keys}, optional={"attributes": attributes})
requests = st.one_of(
    st.tuples(st.just("POST"), st.just("/children"), children),
    st.tuples(st.just("DELETE"), st.just("/children"), st.fixed_dictionaries({"key": child_keys})),
    st.tuples(
        st.just("PATCH"),
        st.just("/children"),
        st.fixed_dictionaries({"key": st.one_of(lines, child_keys), "amount": amounts}),
    ),
    st.tuples(st.just("POST"), st.just("/allocations"), allocations),
    st.tuples(
        st.sampled_from(["POST", "DELETE", "PATCH"]),
        st.sampled_from(["/children", "/allocations"]),
        st.one_of(
            st.text(max_size=30),
            st.sampled_from(["", "null", "[]", '{"key": 1}', "[" * 5000 + "]" * 5000]),
            values,
            st.fixed_dictionaries({"key": child_keys, "x": values}),
        ),
    ),
)
headers = st.one_of(
    st.just({}),
    st.sampled_from(["k1", "k2", "k3", "k" * 300]).map(lambda key: {"Idempotency-Key": key}),
)


def test_generated_requests_never_get_a_5xx_and_leave_nothing_for_the_audit(
    stack: Stack,
) -> None:
    for item in PARENTS:
        stack.put(item)
    writer_api._writers.cache_clear()
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(st.tuples(requests, headers), min_size=1, max_size=4))
    def run(calls: list[tuple[tuple[str, str, Any], dict[str, str]]]) -> None:
        for (method, path, body), header in calls:
            status, answer = invoke(method, path, body, header)
            statuses[status] += 1
            assert status < 500, (method, path, body, header, answer)

    try:
        run()
    finally:
        writer_api._writers.cache_clear()
    print(f"\n[properties] statuses: {dict(sorted(statuses.items()))}")
    assert {200, 201, 404, 409, 422} <= set(statuses)  # the run reached every kind of answer
    report = full_audit(runtime.reconciler())
    assert report.findings == Counter(), report
    assert report.parents["likes"] >= 1 and report.parents["order-total"] >= 1
