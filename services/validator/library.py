"""The validator's public face: what ``runctl validate``, the validator service and the runner call.

results = check_config(resolved.model)          # classes 2-9, static
results = check_resolved(resolved, live=True)   # class 1 passed (it resolved), then classes 2-9
resolved, results = check_file(path)            # a config file: its problems as class-1 results, or the above
results, config = check_submission(payload, run_id)   # class 1 on a submission, then the rest
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from runctl.config.loader import ResolvedConfig, load_config
from runctl.config.models import RunConfig
from runctl.errors import ConfigError
from runctl.events.checks import CheckResult

if TYPE_CHECKING:
    from runctl.events.payloads import ConfigSubmitted
from services.validator.checks.schema import issue_results, schema_checks, schema_ok
from services.validator.registry import CHECK_TIMEOUT_S, REGISTRY, Check

# What code outside the validator uses; the validator's own service also calls check_submission and counts.
__all__ = ["check_config", "check_file", "check_resolved", "registered"]


def check_config(
    config: RunConfig, live: bool = False, host: bool = False, timeout_s: float = CHECK_TIMEOUT_S
) -> list[CheckResult]:
    """Every check (classes 2-9) that applies to the config's run type, in class order. Live probes (bus, tracker,
    ports, clusters) run only with ``live``; they make network calls, so callers inside an event loop leave it off
    (or call from a thread). Probes of this machine (the sandbox backend the run will use) run with ``host`` or
    ``live``: ``runctl run`` and the runner run them, the validator service does not (it may not be where the run
    executes). Each check has ``timeout_s`` (past it, or raising, it is fatal; the others still run)."""
    return REGISTRY.run(config, live, host, timeout_s)


def check_resolved(resolved: ResolvedConfig, live: bool = False, host: bool = False) -> list[CheckResult]:
    """Class 1 passed (the config resolved); then classes 2-9, with the live probes when ``live`` and the probes
    of this machine when ``host`` (see :func:`check_config`)."""
    set_above_default = sum(1 for s in resolved.settings.values() if s.layer != "default")
    return [schema_ok(resolved.run_type, set_above_default), *check_config(resolved.model, live=live, host=host)]


def check_file(path: str | Path, live: bool = False) -> tuple[ResolvedConfig | None, list[CheckResult]]:
    """A config file checked: (the resolved config, every check), or (None, its problems as class-1 results)."""
    try:
        resolved = load_config(path)
    except ConfigError as e:
        return None, issue_results(e)
    return resolved, check_resolved(resolved, live)


def check_submission(submitted: ConfigSubmitted, run_id: str, timeout_s: float = CHECK_TIMEOUT_S) -> list[CheckResult]:
    """Class 1 on a submission's resolved values, then, if it passes, the static checks (each with ``timeout_s``)."""
    results, config = schema_checks(submitted, run_id)
    if config is None:
        return results
    return results + check_config(config, timeout_s=timeout_s)


def counts(results: list[CheckResult]) -> Counter[str]:
    """How many results of each severity."""
    return Counter(r.severity for r in results)


def registered() -> list[Check]:
    """Every registered check, for documentation."""
    return sorted(REGISTRY.checks, key=lambda c: (c.check_class, c.id))
