"""How long a CPU replica of the tiny model takes to answer, as a run starts it, against vLLM's defaults.

A run's replica on a machine without GPUs (``services/launcher/rollout/replicas.py``) forks its engine core from the
API server (``runctl_replica_serve``), runs its model in the engine core's process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and compiles nothing (``TORCH_COMPILE_DISABLE=1``); vLLM's default on CPU
spawns the engine core (a second import of torch and vLLM), starts a worker process of its own for the model and, at
the first request that asks for logprobs (every request of a run does), compiles its logprob op with torch's
inductor. This script starts the server with the command line and environment a run gives it, and with vLLM's
defaults, one after the other, ``--repeat`` times each, and for each prints the seconds until ``/health`` answers
and a chat completion with logprobs returns, the CPU seconds and the memory of its processes at that point; then the
ratios (runctl's layout over vLLM's default). Target: a ratio of start time at most 0.8.

    python bench/replica_start.py [--repeat 2] [--model .cache/tinymodel]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from runctl.config import load_config  # noqa: E402
from runctl.home import stop_group  # noqa: E402
from runctl.ports import free_port  # noqa: E402
from runctl.sdk import bearer  # noqa: E402
from services.launcher.rollout.groupwatch import command_env  # noqa: E402
from services.launcher.rollout.replicas import vllm_argv, vllm_env, with_guard  # noqa: E402

TARGET_RATIO = 0.8
LAYOUTS = {
    "runctl": {},
    "vllm-default": {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "TORCH_COMPILE_DISABLE": "0",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",  # what vLLM's CPU platform sets (runctl_replica_serve keeps it)
    },
}


def group_usage(group: int) -> tuple[float, float]:
    """CPU seconds and resident GiB of the live processes of process group ``group``."""
    cpu = rss = 0.0
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != group:
                continue
            cpu += (int(fields[11]) + int(fields[12])) / tick
            rss += int((stat.parent / "statm").read_text().split()[1]) * page / 2**30
        except (OSError, ValueError, IndexError):
            continue
    return cpu, rss


def start_once(model: Path, layout: dict[str, str]) -> tuple[float, float, float]:
    config = load_config(ROOT / "configs" / "examples" / "infer-cpu.env", environ={"MODEL_PATH": str(model)}).model
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="replica-start-") as tmp:
        key = secrets.token_urlsafe(24)  # a run's replica requires its key (health answers without it)
        pythonpath = with_guard(os.environ.get("PYTHONPATH"))
        env = {**command_env(tmp), **vllm_env("127.0.0.1", cpu=True, key=key), "PYTHONPATH": pythonpath, **layout}
        log = open(Path(tmp) / "server.log", "wb")  # noqa: SIM115
        began = time.monotonic()
        proc = subprocess.Popen(
            vllm_argv(config, sys.executable, "127.0.0.1", port),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            while True:
                if proc.poll() is not None:
                    log.flush()
                    tail = (Path(tmp) / "server.log").read_text()[-3000:]
                    raise SystemExit(f"the server exited {proc.returncode}:\n{tail}")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - began > 600:
                    raise SystemExit("the server did not answer within 600 s")
                time.sleep(0.2)
            # As a run's proxy asks every request: with the sampled tokens' logprobs.
            body = {"model": config.served_model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            body["logprobs"] = True
            httpx.post(f"{url}/v1/chat/completions", json=body, headers=bearer(key), timeout=120).raise_for_status()
            ready = time.monotonic() - began
            cpu, rss = group_usage(proc.pid)
        finally:
            stop_group(proc.pid, grace_s=60)
            proc.wait()
            log.close()
    return ready, cpu, rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "tinymodel")
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in LAYOUTS}
    for _ in range(args.repeat):
        for name, layout in LAYOUTS.items():  # alternated, so that a busy moment does not favour one layout
            ready, cpu, rss = start_once(args.model.resolve(), layout)
            results[name].append((ready, cpu, rss))
            print(f"{name:<13} ready {ready:6.1f} s   cpu {cpu:6.1f} s   memory {rss:5.2f} GiB")
    median = {name: [statistics.median(r[i] for r in rows) for i in range(3)] for name, rows in results.items()}
    ratio = [a / b for a, b in zip(median["runctl"], median["vllm-default"], strict=True)]
    print("== summary")
    for name, (ready, cpu, rss) in median.items():
        print(f"{name}_ready_s {ready:.1f}  {name}_cpu_s {cpu:.1f}  {name}_memory_gib {rss:.2f}")
    met = ratio[0] <= TARGET_RATIO
    print(f"ready_ratio {ratio[0]:.2f}  (target <= {TARGET_RATIO}: {'met' if met else 'MISSED'})")
    print(f"cpu_ratio {ratio[1]:.2f}  memory_ratio {ratio[2]:.2f}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
