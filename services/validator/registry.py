"""The check registry: every check is a small function with an id, a class (1–9), and what it prevents.

A check returns a :class:`Verdict`; the registry turns it into a ``CheckResult`` event payload. Checks that need
the model's facts are skipped, with the reason, when ``config.json`` cannot be read.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from runctl.config.models import RunConfig, RunType
from runctl.events.checks import CheckResult, Severity
from services.validator.facts import FactsUnavailable, ModelFacts, read_facts

if TYPE_CHECKING:
    from services.validator.settings import ValidatorSettings

ALL_RUN_TYPES: frozenset[RunType] = frozenset({"train", "eval", "infer"})
T = TypeVar("T")


@dataclass(frozen=True)
class Verdict:
    """A check's outcome: severity, what it means (what happens if ignored), and the fix."""

    severity: Severity
    message: str
    fix: str = ""


def ok(message: str) -> Verdict:
    return Verdict("ok", message)


def warn(message: str, fix: str) -> Verdict:
    return Verdict("warn", message, fix)


def fatal(message: str, fix: str) -> Verdict:
    return Verdict("fatal", message, fix)


def skip(reason: str) -> Verdict:
    return Verdict("skip", reason)


@dataclass
class Context:
    """What every check sees: the validated config and, when readable, the model's facts."""

    config: RunConfig
    facts: ModelFacts | None = None
    facts_missing: str = ""
    live: bool = False
    host: bool = False
    """Probe the machine the run executes on (its sandbox backend): ``runctl run``, the runner, and live validation."""
    _memo: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()`` once per validation: checks that read the same index share one read."""
        if key not in self._memo:
            self._memo[key] = compute()
        result: T = self._memo[key]
        return result

    @property
    def settings(self) -> ValidatorSettings:
        """The environment's settings the probes read (``settings.ValidatorSettings``), read at the first ask."""
        from services.validator.settings import ValidatorSettings

        return self.memo("settings", ValidatorSettings.from_env)

    @classmethod
    def build(cls, config: RunConfig, live: bool = False, host: bool = False) -> Context:
        host = host or live
        if config.engine == "fake":
            return cls(config, None, "ENGINE=fake runs no model", live, host)
        try:
            return cls(config, read_facts(config.model_path), live=live, host=host)
        except FactsUnavailable as e:
            return cls(config, None, e.reason, live, host)


CheckFn = Callable[[Context], Verdict]


@dataclass(frozen=True)
class Check:
    id: str
    check_class: int
    prevents: str
    fn: CheckFn
    run_types: frozenset[RunType] = ALL_RUN_TYPES
    needs_facts: bool = False
    live: bool = False
    host: bool = False
    """A probe of the machine the run executes on: run by `runctl run`, the runner and live validation."""

    def run(self, ctx: Context) -> CheckResult:
        if self.live and not ctx.live:
            verdict = skip("live probe: not run with --static (or by services, which check statically)")
        elif self.host and not ctx.host:
            verdict = skip("probes the machine the run executes on: `runctl run` and the runner run it, not --static")
        elif self.needs_facts and ctx.facts is None:
            verdict = skip(f"needs the model's config.json: {ctx.facts_missing}")
        else:
            verdict = self.fn(ctx)
        return CheckResult(
            id=self.id,
            check_class=self.check_class,
            severity=verdict.severity,
            message=verdict.message,
            fix=verdict.fix,
        )


@dataclass
class Registry:
    checks: list[Check] = field(default_factory=list)

    def register(
        self,
        check_id: str,
        check_class: int,
        prevents: str,
        run_types: Iterable[RunType] = ALL_RUN_TYPES,
        needs_facts: bool = False,
        live: bool = False,
        host: bool = False,
    ) -> Callable[[CheckFn], CheckFn]:
        """Decorator: add a check function under ``check_id``; ``live`` checks probe the world, ``host`` checks the
        machine the run executes on."""

        def add(fn: CheckFn) -> CheckFn:
            if any(c.id == check_id for c in self.checks):
                raise ValueError(f"check id {check_id} registered twice")
            self.checks.append(
                Check(check_id, check_class, prevents, fn, frozenset(run_types), needs_facts, live, host)
            )
            return fn

        return add

    def run(self, config: RunConfig, live: bool = False, host: bool = False) -> list[CheckResult]:
        """Every check that applies to this run type, in class order; live probes only when ``live``, probes of this
        machine when ``host`` or ``live``."""
        ctx = Context.build(config, live, host)
        applicable = [c for c in self.checks if config.run_type in c.run_types]
        return [c.run(ctx) for c in sorted(applicable, key=lambda c: c.check_class)]


REGISTRY = Registry()
check = REGISTRY.register
