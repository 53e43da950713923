"""The followers rule the index tests share: an edge keyed by the follower
(``PK = USER#<follower>, SK = FOLLOWS#...``) names its followee in ``GSI1PK`` and is counted
while ``GSI1SK`` starts ``FOLLOWING#``. Tests that need more (a revision, a repair mode)
extend a copy with ``FOLLOWERS | {...}``."""

from __future__ import annotations

from typing import Any

FOLLOWERS: dict[str, Any] = {
    "name": "followers",
    "kind": "count",
    "parent": {"PK": "USER#*", "SK": "PROFILE"},
    "children": {"PK": "USER#*", "SK": "FOLLOWS#*"},
    "counter": "followerCount",
    "through": {
        "index": "GSI1",
        "partition_key": "GSI1PK",
        "sort_key": "GSI1SK",
        "sort_prefix": "FOLLOWING#",
    },
}
