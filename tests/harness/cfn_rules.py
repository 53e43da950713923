"""A template's ``Rules`` decided as CloudFormation documents its rule functions, so a test can
say which parameters a deploy refuses before it creates anything.

Modelled (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-rules.html):
``Fn::And``, ``Fn::Or``, ``Fn::Not``, ``Fn::Equals``, ``Fn::Contains`` (a string in a list),
``Fn::EachMemberEquals`` (every member equals the string), ``Ref`` to a parameter (a
``CommaDelimitedList`` is its list) or to ``AWS::Region``. Anything else raises ``ValueError``:
a rule this module cannot decide is never taken as passing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def refused(template: Mapping[str, Any], parameters: Mapping[str, str], region: str) -> list[str]:
    """The AssertDescription of every assertion the parameters fail, in the stack's Region."""
    specs = template.get("Parameters", {})
    values = {name: str(spec.get("Default", "")) for name, spec in specs.items()}
    values |= dict(parameters)
    lists = {name for name, spec in specs.items() if spec.get("Type") == "CommaDelimitedList"}

    def value(node: Any) -> Any:
        if isinstance(node, str):
            return node
        if isinstance(node, list):
            return [value(item) for item in node]
        if isinstance(node, Mapping) and set(node) == {"Ref"}:
            name = node["Ref"]
            if name == "AWS::Region":
                return region
            return values[name].split(",") if name in lists else values[name]
        return holds(node)

    def holds(node: Any) -> bool:
        if not (isinstance(node, Mapping) and len(node) == 1):
            raise ValueError(f"rule {node!r} is not modelled")
        ((function, args),) = node.items()
        if function == "Fn::And":
            return all(holds(arg) for arg in args)
        if function == "Fn::Or":
            return any(holds(arg) for arg in args)
        if function == "Fn::Not":
            return not holds(args[0])
        if function == "Fn::Equals":
            return bool(value(args[0]) == value(args[1]))
        if function == "Fn::Contains":
            return value(args[1]) in value(args[0])
        if function == "Fn::EachMemberEquals":
            return all(member == value(args[1]) for member in value(args[0]))
        raise ValueError(f"rule function {function} is not modelled")

    failed = []
    for rule in template.get("Rules", {}).values():
        if "RuleCondition" in rule and not holds(rule["RuleCondition"]):
            continue
        failed += [a["AssertDescription"] for a in rule["Assertions"] if not holds(a["Assert"])]
    return failed
