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
    raise EngineUnavailableError(
        f"ENGINE={name} cannot run yet: this build of the launcher carries runs with ENGINE=fake only "
        "(synthetic events, no model); the local and verl engines arrive with the runner. "
        "Fix: set ENGINE=fake to preview the lifecycle."
    )
