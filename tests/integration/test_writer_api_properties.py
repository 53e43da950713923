"""Generated requests through the writer API's real handler on DynamoDB Local.

Whatever the body, and whichever event shape carries it (REST API v1 or HTTP API v2, plain
or base64), the API answers below 500; every refused request (4xx) leaves the table as it
was, byte for byte (under an idempotency key, the counted items: the key's guard may record
an outcome); afterwards the full audit finds nothing: every accepted request kept its
counter exact.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.audit.full_audit import full_audit
from tally.handlers import writer_api
from tally.reconciler import runtime
from tally.rules import REPAIR_MARKER
from tally.writers.allocations import STRATEGIES
from tally.writers.idempotency import GUARD_PREFIX
from tests.harness.http import encoded, http_event, invoke_event, rest_event
from tests.integration.conftest import Stack
from tests.integration.test_writer_api_refusals import snapshot

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
# How API Gateway carries the request: payload version, and whether the body is base64
# (a binary media type), or flagged base64 without being so.
shapes = st.sampled_from(
    ["v2", "v1", "v2-base64", "v1-base64"] * 3 + ["v2-not-base64", "v1-not-base64"]
)


def event(shape: str, method: str, path: str, body: Any, header: dict[str, str]) -> dict[str, Any]:
    made = (rest_event if shape.startswith("v1") else http_event)(method, path, body, header)
    if shape.endswith("-base64") and not shape.endswith("not-base64"):
        return encoded(made)
    if shape.endswith("not-base64"):
        return {**made, "body": "%%" + str(made["body"])[:20], "isBase64Encoded": True}
    return made


def counted(items: list[str]) -> list[str]:
    """The items the rules count, without the idempotency keys' guards."""
    return [item for item in items if GUARD_PREFIX not in item]


def test_generated_requests_never_get_a_5xx_and_leave_nothing_for_the_audit(
    stack: Stack,
) -> None:
    for item in PARENTS:
        stack.put(item)
    writer_api._writers.cache_clear()
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=80,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(st.tuples(requests, headers, shapes), min_size=1, max_size=4))
    def run(calls: list[tuple[tuple[str, str, Any], dict[str, str], str]]) -> None:
        for (method, path, body), header, shape in calls:
            before = snapshot(stack.dynamodb, stack.table)
            status, answer = invoke_event(event(shape, method, path, body, header))
            statuses[status] += 1
            assert status < 500, (method, path, body, header, shape, answer)
            if 400 <= status < 500:
                after = snapshot(stack.dynamodb, stack.table)
                assert counted(after) == counted(before), (method, path, body, answer)
                if not header:
                    assert after == before, (method, path, body, answer)
                assert len(str(answer)) <= 4096

    try:
        run()
    finally:
        writer_api._writers.cache_clear()
    print(f"\n[properties] statuses: {dict(sorted(statuses.items()))}")
    assert {200, 201, 400, 404, 409, 422} <= set(statuses)  # every kind of answer was reached
    report = full_audit(runtime.reconciler())
    assert report.findings == Counter(), report
    assert report.parents["likes"] >= 1 and report.parents["order-total"] >= 1
