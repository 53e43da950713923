"""Loading the rules file: read the TOML, validate it against the model, then against the
structural checks of ``tally.rules.validation``; every problem names the rule and field."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tally.rules.rule_set import RulesDocument, RuleSet
from tally.rules.table_keys import PK_SK, TableKeys
from tally.rules.validation import describe, structural_problems

DEFAULT_RULES_FILE = Path(__file__).resolve().parents[2] / "rules.toml"


class RulesFileError(ValueError):
    """The rules file is unreadable or breaks a rule; the message names the rule and field."""


def load_rules(path: str | Path | None = None) -> RuleSet:
    """Load and validate a rules file (default: ``$RULES_FILE`` or the bundled example)."""
    path = Path(path or os.environ.get("RULES_FILE") or DEFAULT_RULES_FILE)
    try:
        if not path.is_absolute() and not path.exists() and "LAMBDA_TASK_ROOT" in os.environ:
            path = Path(os.environ["LAMBDA_TASK_ROOT"]) / path
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise RulesFileError(f"rules file {path}: {error}") from error
    except UnicodeDecodeError as error:
        byte = f"byte {error.object[error.start]:#04x} at offset {error.start}"
        raise RulesFileError(f"rules file {path}: not UTF-8 text ({byte})") from None
    except RecursionError:
        raise RulesFileError(f"rules file {path}: nested too deeply to read") from None
    return parse_rules(raw, source=str(path))


def parse_rules(raw: Mapping[str, Any], source: str = "<rules>") -> RuleSet:
    """Validate a parsed rules document; every problem names the rule and the field."""
    try:
        # The key schema first: member patterns are fields named after its attributes.
        table = TableKeys.model_validate(raw["table"]) if "table" in raw else PK_SK
    except ValidationError:
        table = PK_SK  # the document's validation below reports what is wrong with it
    try:
        document = RulesDocument.model_validate(raw, context={"table": table})
    except ValidationError as error:
        raise RulesFileError(describe(error, raw, source)) from None
    rule_set = RuleSet(document.table, list(document.rules))
    problems = list(structural_problems(rule_set))
    if problems:
        raise RulesFileError(f"rules file {source}:\n  " + "\n  ".join(problems))
    return rule_set
