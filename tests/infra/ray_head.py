"""A real Ray head for the tests, started only inside a loopback-only network namespace.

Ray listens on the machine's routable address whatever it is told, so the suite runs inside ``unshare --net``
(scripts/test.sh arranges it) and these helpers refuse to start Ray anywhere else. Ray is stopped by killing
the process group this module started, never with ``ray stop``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from runctl.ports import free_ports
from services.launcher.rollout.cluster import LOCAL_HEAD_ENV
from tests.conftest import wait_until

START_TIMEOUT_S = 180  # a loaded CI host has taken over 90 s for the head and its dashboard


def in_loopback_only_netns() -> bool:
    """True when the only network interface this process sees is ``lo``."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def why_unavailable() -> str | None:
    if not in_loopback_only_netns():
        return "Ray is only started inside a loopback-only network namespace: run the suite with scripts/test.sh"
    if shutil.which("ray", path=str(Path(sys.executable).parent)) is None:
        return "ray is not installed (pip install 'ray[default]')"
    return None


@dataclass(frozen=True)
class RayHead:
    gcs_address: str
    dashboard_url: str


def alive_nodes(dashboard_url: str) -> int:
    # A head started from a process that holds a Ray token (a local head runctl started earlier in this process
    # keeps its token, as Ray does) runs with token authentication: its dashboard wants the token too.
    token = os.environ.get("RAY_AUTH_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        reply = httpx.get(f"{dashboard_url}/api/v0/nodes", headers=headers, timeout=2).json()
        return sum(n["state"] == "ALIVE" for n in reply["data"]["result"]["result"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return 0


@contextmanager
def ray_head(num_cpus: int = 1, num_gpus: int = 0, dashboard_port: int | None = None) -> Iterator[RayHead]:
    """Start ``ray start --head --block`` on 127.0.0.1 and wait until its dashboard lists it alive."""
    reason = why_unavailable()
    if reason:
        raise RuntimeError(reason)
    temp = Path(tempfile.mkdtemp(prefix="rr-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    port, picked, client, agent = free_ports(4)
    dashboard = dashboard_port or picked
    ray = str(Path(sys.executable).parent / "ray")
    args = [ray, "start", "--head", "--block", "--disable-usage-stats", f"--port={port}", f"--temp-dir={temp}"]
    args += ["--node-ip-address=127.0.0.1", "--include-dashboard=true", "--dashboard-host=127.0.0.1"]
    args += [f"--dashboard-port={dashboard}", f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}"]
    # Ray's other listeners with a fixed default (client server 10001, dashboard agent 52365): two heads, or one
    # and an orphan of an earlier run, would both claim them. The rest default to free ports, or (workers) to a
    # range the raylet checks before it hands a port out.
    args += [f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}"]
    env = {**os.environ, **LOCAL_HEAD_ENV}
    log = (temp / "head.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{dashboard}"
    try:
        try:
            wait_until(lambda: proc.poll() is not None or alive_nodes(url) >= 1, START_TIMEOUT_S, "the Ray head")
        except AssertionError as e:
            busiest = subprocess.run(
                ["ps", "-eo", "pid,pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True
            )
            raise AssertionError(
                f"{e}; its log ends:\n{(temp / 'head.log').read_text()[-1500:]}\nbusiest processes:\n"
                + "\n".join(busiest.stdout.splitlines()[:8])
            ) from None
        if proc.poll() is not None:
            raise RuntimeError(f"ray exited with {proc.returncode}: {(temp / 'head.log').read_text()[-2000:]}")
        yield RayHead(f"127.0.0.1:{port}", url)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


_SERVER_ACTOR = """
import sys, ray
ray.init(address=sys.argv[1], namespace=sys.argv[3])

@ray.remote
class Server:
    def __init__(self, port):
        self.port = port
        self.global_steps = 4  # the weight version, as verl's trainer sets it on its servers
    def get_server_address(self):
        return "127.0.0.1", self.port

Server.options(name="vllm_server_0_0", lifetime="detached", num_cpus=0).remote(int(sys.argv[2]))
ray.get(ray.get_actor("vllm_server_0_0").get_server_address.remote())
"""


def start_server_actor(head: RayHead, port: int, namespace: str = "verl") -> None:
    """A detached actor named as verl names its vLLM servers (``vllm_server_0_0``, in ``namespace``: verl's job's)
    whose ``get_server_address`` names ``127.0.0.1:port`` and which serves weight version 4 (verl's
    ``global_steps``), made by a driver of its own as verl's trainer makes them."""
    argv = [sys.executable, "-c", _SERVER_ACTOR, head.gcs_address, str(port), namespace]
    made = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if made.returncode != 0:
        raise RuntimeError(f"the stand-in server actor was not made: {made.stderr[-2000:]}")
