"""The validator's public face: what ``runctl validate``, the validator service and the runner call.

results = check_config(resolved.model)          # classes 2-9, static
results, config = check_submission(payload, run_id)   # class 1 on a submission, then the rest
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from runctl.config.models import RunConfig
from runctl.events.checks import CheckResult

if TYPE_CHECKING:
    from runctl.events.payloads import ConfigSubmitted
from services.validator.checks.schema import issue_results, schema_checks, schema_ok
from services.validator.registry import REGISTRY, Check

__all__ = ["check_config", "check_submission", "counts", "issue_results", "registered", "schema_ok"]


def check_config(config: RunConfig, live: bool = False) -> list[CheckResult]:
    """Every check (classes 2-9) that applies to the config's run type, in class order. Live probes (bus, tracker,
    ports) run only with ``live``; they make network calls, so callers inside an event loop leave it off."""
    return REGISTRY.run(config, live)


def check_submission(submitted: ConfigSubmitted, run_id: str) -> list[CheckResult]:
    """Class 1 on a submission's resolved values, then, if it passes, the static checks."""
    results, config = schema_checks(submitted, run_id)
    if config is None:
        return results
    return results + check_config(config)


def counts(results: list[CheckResult]) -> Counter[str]:
    """How many results of each severity."""
    return Counter(r.severity for r in results)


def registered() -> list[Check]:
    """Every registered check, for documentation."""
    return sorted(REGISTRY.checks, key=lambda c: (c.check_class, c.id))
