"""Settings come from the environment; a bad one is named, the environment is never echoed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.settings import Settings, SettingsError, settings


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    settings.cache_clear()
    monkeypatch.setattr("tally.core.settings.os.environ", {"SECRET_TOKEN": "s3cr3t-value"})


def test_a_missing_variable_is_named_and_nothing_else_is_shown() -> None:
    with pytest.raises(SettingsError) as caught:
        settings()
    assert str(caught.value) == "environment variable TABLE_NAME is not set"


@given(st.text(min_size=1, max_size=30).filter(lambda v: not v.strip().isdigit()))
def test_a_malformed_variable_is_named_without_its_value(budget: str) -> None:
    settings.cache_clear()
    secret = "s3cr3t-value"
    environment = {"TABLE_NAME": "tally-table", "REPAIR_BUDGET": budget, "SECRET_TOKEN": secret}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tally.core.settings.os.environ", environment)
        try:
            settings()
        except SettingsError as error:
            message = str(error)
            assert message.startswith("environment variable REPAIR_BUDGET is invalid")
            assert secret not in message
        else:
            # pydantic accepts some spellings of whole numbers ("+1", "1_0"); they must be valid.
            assert settings().repair_budget >= 0


def test_require_names_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"^environment variable ALERT_TOPIC_ARN is not set$"):
        Settings.model_validate({"TABLE_NAME": "tally-table"}).require("alert_topic_arn")


def test_a_strongly_consistent_global_table_is_a_setting_of_a_global_table_only() -> None:
    from tally.reconciler import runtime

    base = {"TABLE_NAME": "tally-table", "AWS_REGION": "eu-west-1"}
    regions = {"GLOBAL_REGIONS": "us-east-1,eu-west-1,ap-southeast-2"}
    for environment, strong in [
        (base | regions, False),
        (base | regions | {"GLOBAL_CONSISTENCY": "eventual"}, False),
        (base | regions | {"GLOBAL_CONSISTENCY": "strong"}, True),
    ]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("tally.core.settings.os.environ", environment)
            settings.cache_clear()
            runtime.global_mode.cache_clear()
            mode = runtime.global_mode()
            assert mode is not None and mode.strong is strong
    for wrong in [
        base | {"GLOBAL_CONSISTENCY": "strong"},
        base | regions | {"GLOBAL_CONSISTENCY": "mrsc"},
    ]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("tally.core.settings.os.environ", wrong)
            settings.cache_clear()
            with pytest.raises(SettingsError, match="GLOBAL_CONSISTENCY"):
                settings()
    settings.cache_clear()
    runtime.global_mode.cache_clear()
