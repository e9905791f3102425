"""The weight-sync interface the train loop calls after every update."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class SyncReport:
    step: int
    seconds: float
    replicas: int
    restarts: int = 0
    """Replicas that had to be restarted because their reload failed (``perf/weight_sync_restarts``)."""


class WeightSync(Protocol):
    async def sync(self, folder: Path, step: int) -> SyncReport:
        """Make every replica serve the weights in ``folder`` (a Hugging Face folder: config and safetensors).

        Raises:
            EngineError: a replica serves neither the new weights nor, after a restart, anything at all.
        """
        ...
