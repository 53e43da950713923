"""The SSM parameter that holds the repair switches: read through Powertools' parameters
utility and kept ``max_age`` seconds per warm container, so a flip reaches every function
within that time; a parameter that cannot be read, or holds what the switches are not, fails
safe (no repairs, alerts continue) and says why."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parameters import GetParameterError, SSMProvider

from tally.reconciler.repair.switches import Switches, SwitchesError, parse_switches


class SwitchParameter:
    """One parameter's switches, read at most once per ``max_age`` seconds."""

    def __init__(self, name: str, ssm_client: Any, max_age: int):
        self.name = name
        self.max_age = max_age
        self._provider = SSMProvider(boto3_client=ssm_client)

    @property
    def source(self) -> str:
        return f"parameter {self.name}"

    def read(self) -> Switches:
        try:
            text = self._provider.get(self.name, max_age=self.max_age)
        except GetParameterError as error:
            return Switches.failing_safe(self.source, str(error) or type(error).__name__)
        try:
            return parse_switches(text, self.source)
        except SwitchesError as error:
            return Switches.failing_safe(self.source, str(error))
