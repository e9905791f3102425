"""``python -m services.proxy``: the proxy as a runctl service (health on the bus, the HTTP proxy alongside).

Environment: ``RUNCTL_PROXY_UPSTREAMS`` (comma-separated ``http://HOST:PORT`` replicas), ``RUNCTL_PROXY_DISCOVER_RAY``
(``1``: also the ``vllm_server_*`` actors of the Ray cluster at ``RAY_ADDRESS``), ``RUNCTL_PROXY_HOST`` (127.0.0.1),
``RUNCTL_PROXY_PORT`` (0: a free port), ``RUNCTL_PROXY_TRAJECTORY_DIR`` (``$RUNCTL_HOME/trajectories``),
``RUNCTL_PROXY_ADMIN_TOKEN`` (generated when unset). The URL and admin token are written to
``$RUNCTL_HOME/proxy.json`` (readable by its owner only) and the URL is in the health reply.
"""

from __future__ import annotations

import json
import os

from runctl.home import home as runctl_home
from runctl.service import ServiceRuntime, run_service
from services.proxy.server import ProxyServer


async def main(runtime: ServiceRuntime) -> None:
    upstreams = [u.strip() for u in os.environ.get("RUNCTL_PROXY_UPSTREAMS", "").split(",") if u.strip()]
    home = runctl_home()
    proxy = ProxyServer(
        upstreams,
        host=os.environ.get("RUNCTL_PROXY_HOST", "127.0.0.1"),
        port=int(os.environ.get("RUNCTL_PROXY_PORT", "0")),
        trajectory_dir=os.environ.get("RUNCTL_PROXY_TRAJECTORY_DIR") or home / "trajectories",
        admin_token=os.environ.get("RUNCTL_PROXY_ADMIN_TOKEN") or None,
        discover_ray=os.environ.get("RUNCTL_PROXY_DISCOVER_RAY", "0") == "1",
        ray_address=os.environ.get("RAY_ADDRESS"),
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
    run_service(main, "proxy")
