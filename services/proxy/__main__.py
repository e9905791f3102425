"""``python -m services.proxy``: the proxy as a runctl service (health on the bus, the HTTP proxy alongside).

Its settings (``RUNCTL_PROXY_*``, ``RAY_ADDRESS``) are ``settings.ProxySettings``, listed in docs/services.md. The URL
and admin token are written to ``$RUNCTL_HOME/proxy.json`` (readable by its owner only) and the URL is in the health
reply.
"""

from __future__ import annotations

import json
import os

from runctl.home import home as runctl_home
from runctl.service import ServiceRuntime, run_service
from services.proxy.server import ProxyServer
from services.proxy.settings import ProxySettings


async def main(runtime: ServiceRuntime, settings: ProxySettings) -> None:
    home = runctl_home()
    proxy = ProxyServer(
        settings.upstreams,
        host=settings.host,
        port=settings.port,
        trajectory_dir=settings.trajectory_dir or home / "trajectories",
        admin_token=settings.admin_token,
        discover_ray=settings.discover_ray,
        ray_address=settings.ray_address,
        upstream_key=settings.upstream_key,
    )
    await proxy.start()
    runtime.on_stop(proxy.close)
    record = home / "proxy.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": proxy.url, "admin_token": proxy.admin_token, "pid": os.getpid()}, f)
    runtime.health_info(
        lambda: {
            "serving": True,
            "url": proxy.url,
            "sessions_open": len(proxy.by_id),
            "replicas": {r.name: r.state for r in proxy.pool.replicas.values()},
        }
    )


if __name__ == "__main__":
    run_service(main, "proxy", ProxySettings)
