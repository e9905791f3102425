"""The Ray phase: attach to ``RAY_ADDRESS`` (or start a local head) and wait until NNODES nodes are alive.

Blocking (Ray's client API): call these from a thread. One process holds one Ray connection; runs carried by the
same process share it, and a local head this process started is shut down when its last run lets go of it.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from runctl.events import ClusterReady
from services.launcher.errors import EngineError

#: How long the runner waits for NNODES nodes; ``RUNCTL_NODES_TIMEOUT_SEC`` in the environment overrides it.
NODES_TIMEOUT_S = 600.0
_lock = threading.Lock()
_users = 0
_started_here = False


@dataclass(frozen=True)
class Cluster:
    address: str
    nodes: list[dict[str, Any]]
    num_cpus: float
    num_gpus: float
    started_local_head: bool

    def ready(self, nnodes: int) -> ClusterReady:
        """The ``cluster.ready`` event of a run that asked for ``nnodes`` nodes."""
        return ClusterReady(
            ray_address=self.address,
            num_nodes=len(self.nodes),
            num_nodes_expected=nnodes,
            num_gpus=self.num_gpus,
            num_cpus=self.num_cpus,
        )


def _describe(nodes: list[dict[str, Any]]) -> str:
    if not nodes:
        return "none"
    parts = []
    for node in nodes:
        resources = node.get("Resources", {})
        state = "alive" if node.get("Alive") else "dead"
        parts.append(
            f"{node.get('NodeManagerAddress', '?')} ({state}, {resources.get('CPU', 0):g} CPU, "
            f"{resources.get('GPU', 0):g} GPU)"
        )
    return ", ".join(parts)


def connect(ray_address: str | None, nnodes: int, timeout_s: float | None = None) -> Cluster:
    """Attach to the cluster at ``ray_address`` (else ``$RAY_ADDRESS``, else a local head started here) and wait
    until ``nnodes`` nodes are alive.

    Raises:
        EngineError: Ray cannot be reached or started, or fewer than ``nnodes`` nodes are alive in time (phase
            ``ray``; the message names the nodes seen).
    """
    import ray

    global _users, _started_here
    address = ray_address or os.environ.get("RAY_ADDRESS") or None
    with _lock:
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
                else:
                    _own_token()
                    ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
                    _started_here = True
            except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError …
                where = f"the Ray cluster at {address}" if address else "a local Ray head"
                fix = "check RAY_ADDRESS and that the head is up" if address else "check `ray` is installed"
                raise EngineError(
                    f"could not attach to {where}: {type(e).__name__}: {e}. Fix: {fix}.", phase="ray"
                ) from e
        _users += 1
    try:
        wait_s = timeout_s or float(os.environ.get("RUNCTL_NODES_TIMEOUT_SEC", NODES_TIMEOUT_S))
        deadline = time.monotonic() + wait_s
        while True:
            nodes = ray.nodes()  # type: ignore[no-untyped-call]
            alive = [n for n in nodes if n.get("Alive")]
            if len(alive) >= nnodes:
                break
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{len(alive)} of the {nnodes} Ray nodes the run needs (NNODES) are alive after waiting "
                    f"{wait_s:.0f}s; nodes seen: {_describe(nodes)}. Fix: start the missing "
                    "workers (`ray start --address=<head>`), or lower NNODES.",
                    phase="ray",
                )
            time.sleep(1.0)
        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
        return Cluster(
            address=ray.get_runtime_context().gcs_address,
            nodes=alive,
            num_cpus=float(resources.get("CPU", 0)),
            num_gpus=float(resources.get("GPU", 0)),
            started_local_head=_started_here,
        )
    except BaseException:
        release()
        raise


def _own_token() -> None:
    """A local head uses token authentication (Ray's default) with a token of this process's own: Ray would
    otherwise write one into ``~/.ray/auth_token``, and every Ray cluster later started on the machine would then
    demand it. Whoever set ``RAY_AUTH_*`` keeps their choice."""
    if not any(os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def release() -> None:
    """Let go of the connection ``connect`` made; the last user of a local head started here shuts it down."""
    import ray

    global _users, _started_here
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _started_here:
            ray.shutdown()
            _started_here = False
