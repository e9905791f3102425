"""A weight sync that only records what it was asked: for tests, and for runs without replicas."""

from __future__ import annotations

from pathlib import Path

from services.launcher.weights.base import SyncReport


class FakeSync:
    def __init__(self) -> None:
        self.synced: list[tuple[int, Path]] = []

    async def sync(self, folder: Path, step: int) -> SyncReport:
        self.synced.append((step, folder))
        return SyncReport(step=step, seconds=0.0, replicas=0)
