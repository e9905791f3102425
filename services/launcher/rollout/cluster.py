"""The Ray phase: attach to ``RAY_ADDRESS`` (or start a local head) and wait until NNODES nodes are alive.

Blocking (Ray's client API): call these from a thread. One process holds one Ray connection; runs carried by the
same process share it, and a local head this process started is shut down when its last run lets go of it.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from runctl.events import ClusterReady
from services.launcher.errors import EngineError
from services.launcher.settings import LauncherSettings

#: Starts of a local head: Ray gives its raylet a fixed 30 s to register, which a loaded machine can miss.
LOCAL_HEAD_TRIES = 2
#: The environment of every Ray head runctl starts on its own machine: no usage statistics sent out, and no Python
#: workers started ahead for the first driver (one per CPU, Ray's default: on a CPU machine most sit unused, and each
#: costs about a CPU-second to start; a head then costs a third less CPU).
LOCAL_HEAD_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_prestart_worker_first_driver": "0"}
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
    settings = LauncherSettings.from_env()
    address = ray_address or settings.ray_address
    with _lock:
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
                else:
                    _start_local_head()
                    _started_here = True
            except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError …
                where = f"the Ray cluster at {address}" if address else "a local Ray head"
                if address:
                    fix = "check RAY_ADDRESS and that the head is up"
                elif _STARTUP_TIMEOUT in str(e):
                    fix = (
                        f"the machine was too busy for Ray's node to register ({LOCAL_HEAD_TRIES} tries); start a head "
                        "yourself (`ray start --head`) and set RAY_ADDRESS, or run fewer things beside the run"
                    )
                else:
                    fix = "check `ray` is installed"
                raise EngineError(
                    f"could not attach to {where}: {type(e).__name__}: {e}. Fix: {fix}.", phase="ray"
                ) from e
        _users += 1
    try:
        wait_s = timeout_s or settings.nodes_timeout_s
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


_STARTUP_TIMEOUT = "timed out during startup"


def _start_local_head() -> None:
    """``ray.init`` a head of this process's own. A start that fails has the processes it left killed; one that
    failed because Ray gave up waiting for its node to register (a fixed 30 s) is tried again, up to
    ``LOCAL_HEAD_TRIES`` starts."""
    import ray

    _own_token()
    os.environ.update(LOCAL_HEAD_ENV)  # read by the processes ray.init starts
    ray_dir = os.path.dirname(ray.__file__)
    for attempt in range(1, LOCAL_HEAD_TRIES + 1):
        before = _children(os.getpid())
        try:
            ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
            return
        except Exception as e:
            # Kill what this start left (only that: a runner's other threads may have started processes meanwhile),
            # whether or not it is tried again: the runner outlives a run that fails here.
            started = {pid for pid in _children(os.getpid()) - before if ray_dir in _cmdline(pid)}
            _kill(started | {d for pid in started for d in _descendants(pid)})
            ray.shutdown()
            if _STARTUP_TIMEOUT not in str(e) or attempt == LOCAL_HEAD_TRIES:
                raise


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parents() -> dict[int, list[int]]:
    """Each live process's children, read from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    return parents


def _children(pid: int) -> set[int]:
    return set(_parents().get(pid, []))


def _descendants(pid: int) -> set[int]:
    parents = _parents()
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _kill(pids: set[int]) -> None:
    """SIGKILL ``pids`` (processes this process started) and reap those that are its own children."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # a grandchild: its own parent reaps it
            pass
    # A grandchild is gone only once the kernel has torn it down, which takes a while for a large process on a
    # loaded machine: wait for that (bounded), so nothing of the start is left running when this returns.
    deadline = time.monotonic() + KILL_WAIT_S
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


KILL_WAIT_S = 15.0


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _own_token() -> None:
    """A local head uses token authentication (Ray's default) with a token of this process's own: Ray would
    otherwise write one into ``~/.ray/auth_token``, and every Ray cluster later started on the machine would then
    demand it. Whoever set ``RAY_AUTH_*`` keeps their choice."""
    if not LauncherSettings.from_env().ray_auth_set:
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # for the processes ray.init starts


def release() -> None:
    """Let go of the connection ``connect`` made; the last user of a local head started here shuts it down."""
    import ray

    global _users, _started_here
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _started_here:
            ray.shutdown()
            _started_here = False
