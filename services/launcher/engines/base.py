"""The engine interface: what executes an admitted run, phase by phase, publishing events as it goes.

An engine must be resumable: ``RunContext.progress`` holds how far it got, and every event it emits has a key
that is stable across restarts, so a launcher that died mid-run can resume it without losing or doubling
anything.
"""

from __future__ import annotations

from typing import Protocol

from services.launcher.context import Outcome, RunContext

__all__ = ["Engine", "Outcome", "RunContext"]


class Engine(Protocol):
    """Executes one run. Raises EngineError (with the phase) on failure, RunCancelledError when cancelled."""

    name: str

    async def run(self, ctx: RunContext) -> Outcome: ...
