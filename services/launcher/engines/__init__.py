"""Engines behind one interface (``base.Engine``); ``make_engine`` picks one by ``ENGINE``."""

from __future__ import annotations

from services.launcher.engines.base import Engine, Outcome, RunContext
from services.launcher.engines.fake import FakeEngine
from services.launcher.errors import EngineUnavailableError

__all__ = ["Engine", "Outcome", "RunContext", "make_engine"]


def make_engine(name: str) -> Engine:
    """The engine for ``ENGINE=name``.

    Raises:
        EngineUnavailableError: the engine is not available in this build.
    """
    if name == "fake":
        return FakeEngine()
    if name == "local":
        from services.launcher.engines.local import LocalEngine  # imports the proxy and the sandbox backends

        return LocalEngine()
    raise EngineUnavailableError(
        f"ENGINE={name} cannot run yet: this build carries runs with ENGINE=local (infer and eval on one machine "
        "or a Ray cluster) and ENGINE=fake (synthetic events); the verl engine is not built yet. "
        "Fix: set ENGINE=local for infer and eval runs, or ENGINE=fake to preview a train run's lifecycle."
    )
