"""On a Global Table the scheduled full audit runs in the home Region only: every other
Region's would recount the same parents and alert each finding once more."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tally.core.settings import settings
from tally.reconciler import runtime
from tests.utils import lambda_context


@pytest.fixture
def regions(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setenv("TABLE_NAME", "tally-table")
    monkeypatch.setenv("GLOBAL_REGIONS", "us-east-1,eu-west-1")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Test")
    yield monkeypatch
    settings.cache_clear()
    runtime.global_mode.cache_clear()


def test_the_full_audit_does_nothing_outside_the_home_region(
    regions: pytest.MonkeyPatch,
) -> None:
    from tally.handlers import audit

    regions.setenv("AWS_REGION", "eu-west-1")
    settings.cache_clear()
    runtime.global_mode.cache_clear()
    answer = audit.handler({}, lambda_context())
    assert answer == {"skipped": "the full audit runs in the Global Table's home Region"}


def test_the_home_region_is_the_first_unless_named(regions: pytest.MonkeyPatch) -> None:
    for region, home, at_home in [
        ("us-east-1", None, True),
        ("eu-west-1", None, False),
        ("eu-west-1", "eu-west-1", True),
    ]:
        regions.setenv("AWS_REGION", region)
        if home:
            regions.setenv("HOME_REGION", home)
        settings.cache_clear()
        runtime.global_mode.cache_clear()
        assert runtime.at_home() is at_home


def test_a_region_outside_the_table_is_named(regions: pytest.MonkeyPatch) -> None:
    from tally.core.settings import SettingsError

    regions.setenv("AWS_REGION", "sa-east-1")
    settings.cache_clear()
    with pytest.raises(SettingsError, match="AWS_REGION: this function's Region must be one of"):
        settings()
