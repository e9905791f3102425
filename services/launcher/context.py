"""What a run's code is handed: its :class:`RunContext` (identity, config, folder, how to publish its events and save
its progress, whether it was cancelled), and the :class:`Outcome` it reports when it succeeds. Engines, the trial
loop and the trainer all work through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runctl.config import RunConfig
from runctl.events import CheckpointSaved, PhaseStarted, TrialFinished
from runctl.events.payloads import Payload, Phase
from services.launcher.errors import RunCancelledError

if TYPE_CHECKING:
    from runctl.bus import Bus
    from services.sandbox.library import Backend


@dataclass
class Outcome:
    """What a finished run reports in ``run.succeeded``."""

    summary: dict[str, Any]
    score: float | None = None
    synthetic: bool = False


@dataclass
class RunContext:
    """Everything an engine gets for one run."""

    run_id: str
    team: str
    config: RunConfig
    run_dir: Path
    emit_fn: Callable[[Payload, str], Awaitable[None]]
    save_fn: Callable[[dict[str, Any]], Awaitable[None]]
    progress: dict[str, Any] = field(default_factory=dict)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    phase: Phase = "resolve"
    key_suffix: str = ""
    """Appended to the keys of the events an engine emits again when it resumes a run (``.attempt2``)."""
    progress_hook: Callable[[int, int], None] = field(default=lambda done, total: None)
    """Told (trials done, trials in all) when the loop starts; a foreground run shows it."""
    secret_values: frozenset[str] = frozenset()
    """Secrets the config interpolated into other values (a foreground run has them): records show ``***``."""
    pinned_checkpoints: Callable[[], Awaitable[set[int]]] = field(default=lambda: _nothing_pinned())
    """The steps of this run's checkpoints whose eval run has not ended: MAX_CKPT_TO_KEEP never deletes them."""
    pin_checkpoint: Callable[[int, str], Awaitable[None]] | None = None
    """Records a checkpoint's eval (step, path) before its ``checkpoint.saved`` goes out, so that it is pinned
    however late the launcher hears of it: a prune at the next save cannot delete it first."""
    bus: Bus | None = None
    """The bus of a submitted run's runner (a foreground run has none): its sandboxes are booked in the sandbox
    service's ledger through it (services.sandbox.booked)."""

    async def sandboxes(self, stack: AsyncExitStack, backend: Backend) -> Backend:
        """The backend the run's trials use: ``backend`` booked in the sandbox ledger for the rest of ``stack``
        when the run has a bus, else ``backend`` itself."""
        if self.bus is None:
            return backend
        from services.sandbox.library import booked

        return await stack.enter_async_context(booked(backend, self.bus, self.team, self.run_id, self.emit))

    async def emit(self, payload: Payload, key: str) -> None:
        """Publish an event of this run; ``key`` must be stable across restarts (``step.12``)."""
        if isinstance(payload, CheckpointSaved) and not payload.synthetic and self.pin_checkpoint is not None:
            await self.pin_checkpoint(payload.step, payload.path)
        await self.emit_fn(payload, key)
        if isinstance(payload, TrialFinished):
            # Counted in the progress the engine saves next, so a resumed run neither loses nor doubles it.
            self.progress["num_trials"] = self.num_trials + 1

    @property
    def num_trials(self) -> int:
        return int(self.progress.get("num_trials", 0))

    async def enter_phase(self, phase: Phase, total: int | None = None) -> None:
        """Announce a phase; ``total`` is the units it will do where known (trials or steps of the loop)."""
        self.phase = phase
        self.progress["phase"] = phase  # saved with the next progress: where a crashed runner was
        await self.emit(PhaseStarted(phase=phase, total=total), f"phase.{phase}{self.key_suffix}")

    async def save(self, **progress: Any) -> None:
        """Record how far the run got, so a restarted launcher resumes from here."""
        self.progress.update(progress)
        await self.save_fn(dict(self.progress))

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise RunCancelledError(f"run {self.run_id} was cancelled", run_id=self.run_id)


async def _nothing_pinned() -> set[int]:
    return set()
