"""The proxy as its own process: ``runctl proxy serve`` (and the benchmark) run :func:`serve` until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from services.proxy.names import DEFAULT_ALIASES
from services.proxy.server import ProxyServer
from services.proxy.settings import ADMIN_TOKEN_ENV, ProxySettings


def use_fast_loop() -> None:
    """uvloop when installed: the proxy's per-request cost is mostly event-loop work."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(
    upstreams: list[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    advertise_host: str | None = None,
    trajectory_dir: Path | None = None,
    served_model: str | None = None,
    aliases: tuple[str, ...] = DEFAULT_ALIASES,
    discover_ray: bool = False,
    ray_address: str | None = None,
    health_interval_s: float = 5.0,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT; then stop taking requests, finish those in flight and close open sessions."""
    settings = ProxySettings.from_env()
    token = settings.admin_token
    proxy = ProxyServer(
        upstreams,
        host=host,
        port=port,
        advertise_host=advertise_host,
        trajectory_dir=trajectory_dir,
        admin_token=token,
        served_model=served_model,
        aliases=aliases,
        discover_ray=discover_ray,
        ray_address=ray_address,
        health_interval_s=health_interval_s,
        upstream_key=settings.upstream_key,
    )
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"runctl proxy listening on {proxy.url}", flush=True)
    if token is None:
        print(f"admin token (set {ADMIN_TOKEN_ENV} to choose it): {proxy.admin_token}", flush=True)
    sources = ", ".join(upstreams) or "none"
    print(f"upstreams: {sources}{' + Ray actors vllm_server_*' if discover_ray else ''}", flush=True)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        print("runctl proxy stopping: finishing requests in flight", file=sys.stderr, flush=True)
        await proxy.close()
