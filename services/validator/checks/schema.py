"""Class 1, schema and identity, for a submission: its resolved values re-validated against the run type's model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runctl.config.loader import submitted_values, validate_settings
from runctl.config.models import RunConfig
from runctl.errors import ConfigError
from runctl.events.checks import CheckResult

if TYPE_CHECKING:
    from runctl.events.payloads import ConfigSubmitted

SCHEMA_CLASS = 1


def schema_checks(submitted: ConfigSubmitted, run_id: str) -> tuple[list[CheckResult], RunConfig | None]:
    """Types, enums, required keys, unknown keys and leftover placeholders.

    Returns:
        One fatal result per problem (and no config), or a single ok result and the validated config.
    """
    try:
        values = submitted_values(submitted.run_type, submitted.resolved)  # over this cluster's site.env
        config = validate_settings(submitted.run_type, values, source=run_id)
    except ConfigError as e:
        return issue_results(e), None
    return [schema_ok(submitted.run_type, len(values))], config


def issue_results(error: ConfigError) -> list[CheckResult]:
    """A config error's issues as fatal class-1 results."""
    return [
        CheckResult(
            id=issue.code,
            check_class=SCHEMA_CLASS,
            severity="fatal",
            message=f"{issue.path if issue.line is None else f'{issue.path}:{issue.line}'}: {issue.message}",
            fix=issue.fix,
        )
        for issue in error.issues
    ]


def schema_ok(run_type: str, num_keys: int) -> CheckResult:
    return CheckResult(
        id="schema.valid",
        check_class=SCHEMA_CLASS,
        severity="ok",
        message=f"{run_type} config matches its schema ({num_keys} keys set)",
    )
