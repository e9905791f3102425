"""Benchmark of the sandbox layer, in one run, against raw Docker measured in the same run:

1. create-to-first-exec: ``DockerBackend.create`` + ``exec("true")`` against the Docker SDK's bare
   ``containers.run(detach)`` + ``exec_run("true")`` on the same image (ratio; target ≤ 1.3);
2. exec: ``DockerBackend.exec("true")`` (wrapper, PID report, output capture) against ``exec_run("true")``
   (ratio; target ≤ 1.2);
3. warm-pool acquire: a ``create`` request to the sandbox service (over NATS, ledger writes included) while a warm
   sandbox waits (milliseconds; target ≤ 50);
4. trials per minute at concurrency 8 on docker and on local (bubblewrap), oracle agent on the hello task.

Needs a Docker daemon (``DOCKER_HOST``, else one is started here, with no bridge, and stopped after) and
bubblewrap; every server it starts listens on 127.0.0.1 and is stopped by its PID.
Run as ``python bench/sandbox.py`` with the project's virtualenv active.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runctl.bus import Bus  # noqa: E402
from runctl.tasks import load_task  # noqa: E402
from services.sandbox.agents import make_agent  # noqa: E402
from services.sandbox.backends.base import SandboxSpec  # noqa: E402
from services.sandbox.backends.docker_backend import DockerBackend  # noqa: E402
from services.sandbox.backends.local_backend import LocalBackend  # noqa: E402
from services.sandbox.bus_client import SandboxBusClient  # noqa: E402
from services.sandbox.trial import TrialRunner  # noqa: E402
from tests.infra import docker_daemon  # noqa: E402

TASK = ROOT / "tests" / "data" / "tasks" / "hello"
IMAGE = docker_daemon.BASE_IMAGE
TARGETS = {"create_ratio": 1.3, "exec_ratio": 1.2, "warm_acquire_ms": 50.0}


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


@contextlib.contextmanager
def daemon() -> Iterator[str]:
    host = os.environ.get("DOCKER_HOST")
    if host and docker_daemon.answers(host):
        docker_daemon.ensure_base_image(host)
        yield host
        return
    reason = docker_daemon.why_unavailable()
    if reason:
        raise SystemExit(f"no Docker daemon: {reason}")
    with docker_daemon.docker_daemon() as started:
        docker_daemon.ensure_base_image(started.host)
        yield started.host


def create_and_exec(backend: DockerBackend, repeat: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """(raw create+exec, ours create+exec, raw exec, ours exec) samples, interleaved so drift hits both."""
    client = backend.client
    raw_create, ours_create, raw_exec, ours_exec = [], [], [], []
    labels = {"runctl.bench": "sandbox"}
    for i in range(repeat):
        started = time.perf_counter()
        container = client.containers.run(IMAGE, ["sleep", "600"], detach=True, network_mode="none", labels=labels)
        container.exec_run("true")
        raw_create.append(time.perf_counter() - started)
        raw_exec += [timed(partial(container.exec_run, "true")) for _ in range(5)]
        container.remove(force=True)

        spec = SandboxSpec(sandbox_id=f"bench-{os.getpid()}-{i}", image=IMAGE, labels=labels, memory_mb=256)
        started = time.perf_counter()
        sandbox = backend.create(spec)
        backend.exec(sandbox, "true", 30)
        ours_create.append(time.perf_counter() - started)
        ours_exec += [timed(partial(backend.exec, sandbox, "true", 30)) for _ in range(5)]
        backend.destroy(sandbox)
    return raw_create, ours_create, raw_exec, ours_exec


def trials_per_minute(runner: TrialRunner, trials: int, concurrency: int, scratch: Path) -> float:
    task = load_task(TASK)
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(
            pool.map(lambda i: runner.run(task, make_agent("oracle"), scratch / f"trial-{i}"), range(trials))
        )
    elapsed = time.perf_counter() - started
    rewards = [r.reward for r in results]
    if rewards.count(1.0) != trials:
        raise SystemExit(f"trials failed: {[r.failure for r in results if r.reward != 1.0][:2]}")
    return trials / elapsed * 60


async def warm_acquire(host: str, scratch: Path, repeat: int) -> list[float]:
    """Start nats-server and the sandbox service (warm pool of 2, docker), time create requests."""
    from runctl.stack import nats_server_binary
    from tests.conftest import free_port

    port = free_port()
    nats_proc = subprocess.Popen(
        [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(scratch / "js")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"nats://127.0.0.1:{port}"
    env = os.environ | {
        "RUNCTL_NATS_URL": url,
        "RUNCTL_HOME": str(scratch / "home"),
        "DOCKER_HOST": host,
        "RUNCTL_SANDBOX_BACKENDS": "docker",
        "RUNCTL_SANDBOX_WARM": "2",
        "RUNCTL_SANDBOX_SCOPE": f"bench-{os.getpid()}",
    }
    with (scratch / "sandbox.log").open("wb") as log:
        service = subprocess.Popen(
            [sys.executable, "-m", "services.sandbox"], env=env, stdout=log, stderr=log, cwd=ROOT
        )
    samples: list[float] = []
    try:
        bus = await _connect(url)
        client = SandboxBusClient(bus)
        first = await _until_ready(client)  # also fills the pool
        await client.destroy(first)
        for _ in range(repeat):
            await _pool_full(client)
            started = time.perf_counter()
            sandbox = await client.create("bench", TASK, backend="docker")
            samples.append(time.perf_counter() - started)
            await client.destroy(sandbox)
        await bus.close()
    finally:
        for proc in (service, nats_proc):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return samples


async def _connect(url: str) -> Bus:
    deadline = time.monotonic() + 30
    while True:
        try:
            return await Bus.connect(url, name="bench-sandbox")
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _until_ready(client: SandboxBusClient):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 60
    while True:
        try:
            return await client.create("bench", TASK, backend="docker")
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _pool_full(client: SandboxBusClient) -> None:
    """Wait until the service reports a full warm pool (its health reply counts warm sandboxes)."""
    import json

    from runctl.subjects import health_subject

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = await client.bus.nc.request(health_subject("sandbox"), b"", timeout=2)
        if json.loads(reply.data).get("warm", 0) >= 2:
            return
        await asyncio.sleep(0.05)
    raise SystemExit("the warm pool did not fill within 60 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--trials", type=int, default=16)
    args = parser.parse_args()
    with daemon() as host, tempfile.TemporaryDirectory(prefix="rbs-", dir="/tmp") as scratch_dir:
        scratch = Path(scratch_dir)
        docker = DockerBackend(host)
        try:
            raw_create, ours_create, raw_exec, ours_exec = create_and_exec(docker, args.repeat)
            docker_tpm = trials_per_minute(TrialRunner(docker, docker.task_image), args.trials, 8, scratch / "d")
        finally:
            docker.close()
        local = LocalBackend(root=scratch / "sandboxes", cgroup_parent=f"runctl-bench-{os.getpid()}")
        local_tpm = trials_per_minute(TrialRunner(local, local.task_root), args.trials, 8, scratch / "l")
        local.remove_cgroup_parents()
        warm = asyncio.run(warm_acquire(host, scratch, args.repeat))
    create_ratio = median_ms(ours_create) / median_ms(raw_create)
    exec_ratio = median_ms(ours_exec) / median_ms(raw_exec)
    warm_ms = median_ms(warm)
    print(f"== sandbox, medians over {args.repeat} rounds")
    print(f"   raw create + first exec      {median_ms(raw_create):8.1f} ms")
    print(f"   ours create + first exec     {median_ms(ours_create):8.1f} ms   {create_ratio:.2f} × raw")
    print(f"   raw exec                     {median_ms(raw_exec):8.1f} ms")
    print(f"   ours exec                    {median_ms(ours_exec):8.1f} ms   {exec_ratio:.2f} × raw")
    print(f"   warm-pool acquire (service)  {warm_ms:8.1f} ms")
    print(f"   trials/min at 8, docker      {docker_tpm:8.1f}")
    print(f"   trials/min at 8, local       {local_tpm:8.1f}")
    print("== summary")
    for name, value, unit in (
        ("create_ratio", create_ratio, "×"),
        ("exec_ratio", exec_ratio, "×"),
        ("warm_acquire_ms", warm_ms, "ms"),
    ):
        verdict = "MET" if value <= TARGETS[name] else "NOT MET"
        print(f"   {name} {value:.2f} {unit}   target <= {TARGETS[name]} {unit}   {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
