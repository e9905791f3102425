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
    if name == "verl":
        from services.launcher.engines.verl.engine import VerlEngine  # verl itself is imported by verl's workers only

        return VerlEngine()
    raise EngineUnavailableError(
        f"ENGINE={name} is not an engine of this build. Fix: ENGINE=local (one machine, or a Ray cluster), verl "
        "(train runs on GPU clusters), or fake (synthetic events)."
    )
