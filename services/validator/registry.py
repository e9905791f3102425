"""The check registry: every check is a small function with an id, a class (1–9), and what it prevents.

A check returns a :class:`Verdict`; the registry turns it into a ``CheckResult`` event payload. Checks that need
the model's facts are skipped, with the reason, when ``config.json`` cannot be read.

A submission is a team's input, and a check reads files it names: each check runs in a worker thread with a time
limit (``CHECK_TIMEOUT_S``, the validator service's ``RUNCTL_CHECK_TIMEOUT_S``). A check that raises or runs past
it is fatal for that submission with what happened; the worker it hangs in is given up (a daemon thread) and the
next check gets a new one, so one check that never returns costs its time limit, never the validator.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from runctl.config.models import RunConfig, RunType
from runctl.events.checks import CheckResult, Severity
from services.validator.facts import FactsUnavailable, ModelFacts, read_facts

if TYPE_CHECKING:
    from services.validator.settings import ValidatorSettings

ALL_RUN_TYPES: frozenset[RunType] = frozenset({"train", "eval", "infer"})
#: Seconds one check may take (probes of the machine and the cluster carry shorter limits of their own); the
#: validator service's ``RUNCTL_CHECK_TIMEOUT_S`` defaults to it.
CHECK_TIMEOUT_S = 60.0
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

    def run(self, ctx: Context, worker: Worker | None = None, timeout_s: float = CHECK_TIMEOUT_S) -> CheckResult:
        """The check's result; in ``worker`` (with ``timeout_s``) when given, else in this thread."""
        if self.live and not ctx.live:
            verdict = skip("live probe: not run with --static (or by services, which check statically)")
        elif self.host and not ctx.host:
            verdict = skip("probes the machine the run executes on: `runctl run` and the runner run it, not --static")
        elif self.needs_facts and ctx.facts is None:
            verdict = skip(f"needs the model's config.json: {ctx.facts_missing}")
        elif worker is None:
            verdict = self.fn(ctx)
        else:
            verdict = worker.verdict(self, ctx, timeout_s)
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

    def run(
        self, config: RunConfig, live: bool = False, host: bool = False, timeout_s: float = CHECK_TIMEOUT_S
    ) -> list[CheckResult]:
        """Every check that applies to this run type, in class order; live probes only when ``live``, probes of this
        machine when ``host`` or ``live``. Each check (and reading the model's facts) has ``timeout_s``."""
        worker = Worker()
        try:
            ctx = worker.call(lambda: Context.build(config, live, host), timeout_s)
        except CheckTimeout:
            ctx = Context(config, None, f"reading the model's config.json did not finish within {timeout_s:g}s", live)
            ctx.host = host or live
        applicable = [c for c in self.checks if config.run_type in c.run_types]
        try:
            return [c.run(ctx, worker, timeout_s) for c in sorted(applicable, key=lambda c: c.check_class)]
        finally:
            worker.stop()


_Job = tuple[Callable[[], object], "queue.SimpleQueue[tuple[bool, object]]"]
"""A call for the worker, and where its answer goes: (True, value) or (False, the exception it raised)."""


class CheckTimeout(Exception):
    """A call in the worker did not return within its time limit."""


class Worker:
    """One daemon thread that runs calls one after another; a call past its time limit is given up (it may finish
    or hang on its own) and the next call gets a new thread."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], T], timeout_s: float) -> T:
        """``fn()`` in the worker.

        Raises:
            CheckTimeout: it did not return within ``timeout_s`` (the worker is replaced).
            BaseException: what ``fn`` raised.
        """
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, args=(self._jobs,), name="validator-check", daemon=True)
            self._thread.start()
        answer: queue.SimpleQueue[tuple[bool, object]] = queue.SimpleQueue()
        self._jobs.put((fn, answer))
        try:
            ok, value = answer.get(timeout=timeout_s)
        except queue.Empty:
            self._jobs.put(None)  # the hung thread ends if its call ever returns
            self._jobs, self._thread = queue.SimpleQueue(), None
            raise CheckTimeout from None
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]

    def verdict(self, check: Check, ctx: Context, timeout_s: float) -> Verdict:
        """The check's verdict, or a fatal one saying it raised or ran past ``timeout_s``."""
        try:
            return self.call(lambda: check.fn(ctx), timeout_s)
        except CheckTimeout:
            return fatal(
                f"check {check.id} did not finish within {timeout_s:g}s (a file it reads may be a FIFO or on a mount "
                "that does not answer); it was given up and the other checks ran",
                "make every path the config names a regular file or folder on a mount that answers",
            )
        except Exception as e:  # a check's own failure on this input: that check fails, not the validation
            return fatal(
                f"check {check.id} could not run on this config: {type(e).__name__}: {e}",
                "fix what the message names; if it names nothing of the config, report it as a runctl bug",
            )

    def stop(self) -> None:
        self._jobs.put(None)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
        while (job := jobs.get()) is not None:
            fn, answer = job
            try:
                answer.put((True, fn()))
            except BaseException as e:  # handed to the caller, which raises it
                answer.put((False, e))


REGISTRY = Registry()
check = REGISTRY.register
