"""Weight sync by reloading vLLM in place: ``POST /collective_rpc`` with ``reload_weights`` from a fresh folder,
then ``POST /reset_prefix_cache`` (cached prefixes were computed with the old weights).

Those endpoints exist only on servers started with ``VLLM_SERVER_DEV_MODE=1`` (train runs only), which require the
run's replica key like every other path but ``/health``; the proxy forwards nothing but the model surfaces
(``/v1/chat/completions``, ``/v1/completions``, ``/v1/messages``, ``/v1/models``), so agents never reach them.

A replica whose reload fails is restarted on the new folder (``restart``), and the restart is counted: a reload
costs tens of milliseconds, a restart tens of seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from runctl.sdk import bearer
from services.launcher.errors import EngineError
from services.launcher.weights.base import SyncReport

log = logging.getLogger(__name__)

RELOAD_TIMEOUT_S = 600.0

#: Restart one replica (by its index) on the weights in the folder; returns its new URL once it is ready.
Restart = Callable[[int, Path], Awaitable[str]]


async def reload_in_place(client: httpx.AsyncClient, url: str, folder: Path) -> None:
    """Reload one server's weights from ``folder`` and drop its prefix cache.

    Raises:
        httpx.HTTPError: the server refused or did not answer.
    """
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
    reply = await client.post(f"{url}/collective_rpc", json=rpc, timeout=RELOAD_TIMEOUT_S)
    reply.raise_for_status()
    cache = await client.post(f"{url}/reset_prefix_cache", timeout=60.0)
    cache.raise_for_status()


class VllmReload:
    """``key``: the replica key the servers require (``runctl/replica_guard``)."""

    def __init__(self, urls: list[str], restart: Restart, key: str) -> None:
        self.urls = list(urls)
        self.restart = restart
        self.restarts = 0
        self.client = httpx.AsyncClient(headers=bearer(key))

    async def sync(self, folder: Path, step: int) -> SyncReport:
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(reload_in_place(self.client, url, folder) for url in self.urls), return_exceptions=True
        )
        restarted = 0
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, httpx.HTTPError):
                    raise outcome
                log.warning("replica %s: reload of step %d failed (%s); restarting it", self.urls[index], step, outcome)
                try:
                    self.urls[index] = await self.restart(index, folder)
                except Exception as e:
                    raise EngineError(
                        f"replica {index} could neither reload the weights of step {step} ({outcome}) nor restart "
                        f"on them ({type(e).__name__}: {e}). Fix: see the replica's log in the run folder's logs/, "
                        "then resume the run (it continues from its last step).",
                        phase="loop",
                    ) from e
                restarted += 1
        self.restarts += restarted
        return SyncReport(step=step, seconds=time.monotonic() - started, replicas=len(self.urls), restarts=restarted)

    async def close(self) -> None:
        await self.client.aclose()
