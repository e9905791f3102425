"""Validation checks. At this stage: class 1 (schema and identity) over the resolved config of a submission."""

from __future__ import annotations

from runctl.config.loader import validate_settings
from runctl.errors import ConfigError
from runctl.events import CheckResult, ConfigSubmitted

SCHEMA_CLASS = 1


def schema_checks(submitted: ConfigSubmitted, run_id: str) -> list[CheckResult]:
    """Class 1: types, enums, required keys, unknown keys and leftover placeholders.

    Returns:
        One fatal result per problem, or a single ok result.
    """
    values = {key: row.get("value") for key, row in submitted.resolved.items() if row.get("layer") != "default"}
    try:
        validate_settings(submitted.run_type, values, source=run_id)
    except ConfigError as e:
        return [
            CheckResult(id=issue.code, check_class=SCHEMA_CLASS, severity="fatal", message=issue.message, fix=issue.fix)
            for issue in e.issues
        ]
    return [
        CheckResult(
            id="schema.valid",
            check_class=SCHEMA_CLASS,
            severity="ok",
            message=f"{submitted.run_type} config matches its schema ({len(values)} keys set).",
        )
    ]
