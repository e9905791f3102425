"""What each agent scaffold costs a trial: its start inside the sandbox and trials per minute, against the terminal
agent in the same run.

It starts one CPU replica of the tiny model as a run does (``services/launcher/rollout/replicas.py``, its key
required), and the run's proxy in front of it (``open_proxy``: the Unix socket the in-sandbox agents reach through
the relay), then runs ``--trials`` trials of ``examples/tasks/write-done`` on the local backend (bubblewrap, network
off, 1024 MiB each) with each scaffold in turn — ``terminal`` (runctl's agent, on the host), ``mswea``, ``cc``, ``oc``
and ``ohsdk`` (from their bundles: ``runctl agents build``) — ``--rounds`` times, the order rotating. For each trial
it reads the agent phase's seconds (``durations_s.agent_execution``: the agent's start in the sandbox to its end)
and the trial's wall time, and prints, per scaffold, the median agent phase, trials per minute, how the trials ended,
and both as ratios to the terminal agent's. With the tiny model (1024 tokens) no bundled agent's first request fits,
so their agent phase is their start-up and one refused call; the terminal agent solves the task in a few turns.

    python bench/agents.py [--trials 4] [--rounds 2] [--model .cache/tinymodel]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from runctl.config import load_config  # noqa: E402
from runctl.home import stop_group  # noqa: E402
from runctl.ports import free_port  # noqa: E402
from services.launcher.rollout.groupwatch import command_env  # noqa: E402
from services.launcher.rollout.replicas import vllm_argv, vllm_env, with_guard  # noqa: E402

SCAFFOLDS = ("terminal", "mswea", "cc", "oc", "ohsdk")
#: Sandbox memory for every scaffold alike: OpenCode alone needs about 520 MiB (sandbox.agent_memory).
SANDBOX_MEMORY_MB = 1024


def config_file(folder: Path, model: Path, tasks: Path, scaffold: str, trials: int) -> Path:
    text = (ROOT / "configs" / "examples" / "infer-cpu.env").read_text()
    lines = [line for line in text.splitlines() if not line.startswith(("MODEL_PATH=", "INDEX_FILE=", "N_TRIALS="))]
    lines += [f"MODEL_PATH={model}", f"INDEX_FILE={tasks}", f"N_TRIALS={trials}", f"SCAFFOLD={scaffold}"]
    lines.append(f"SANDBOX_MEMORY_MB={SANDBOX_MEMORY_MB}")
    path = folder / f"{scaffold}.env"
    path.write_text("\n".join(lines) + "\n")
    return path


def start_replica(model: Path, folder: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    config = load_config(ROOT / "configs" / "examples" / "infer-cpu.env", environ={"MODEL_PATH": str(model)}).model
    port, key = free_port(), secrets.token_urlsafe(24)
    env = {**command_env(str(folder)), **vllm_env("127.0.0.1", cpu=True, key=key)}
    env["PYTHONPATH"] = with_guard(os.environ.get("PYTHONPATH"))
    log = (folder / "server.log").open("wb")
    proc = subprocess.Popen(
        vllm_argv(config, sys.executable, "127.0.0.1", port), env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    url, began = f"http://127.0.0.1:{port}", time.monotonic()
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the replica exited {proc.returncode}: {(folder / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, key
        except httpx.HTTPError:
            pass
        if time.monotonic() - began > 600:
            raise SystemExit("the replica did not answer within 600 s")
        time.sleep(0.2)


async def trials_of(folder: Path, url: str, key: str, config: Path) -> list[dict[str, Any]]:
    from services.launcher.engines.local import loop_settings, open_proxy, select_tasks
    from services.launcher.rollout.trials import TrialLoop
    from services.sandbox.library import CONFIG_BACKENDS, BackendSettings, open_backend

    run_config = load_config(config, environ={}).model
    out = folder / "trials"
    async with AsyncExitStack() as stack:
        proxy, settings = await open_proxy(stack, [url], loop_settings(run_config), key)
        with open_backend(CONFIG_BACKENDS[run_config.backend], BackendSettings.of(run_config)) as (backend, image_for):
            _, _, tasks = select_tasks(run_config)
            loop = TrialLoop(tasks, out, settings, backend, image_for, proxy, {"runctl.run": "bench"}, _ignore)
            await loop.run(await loop.recover(), asyncio.Event())
    return [json.loads(p.read_text()) for p in sorted(out.glob("*/trial-*/trial.json"))]


async def _ignore(record: dict[str, Any]) -> None:
    pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "tinymodel")
    args = parser.parse_args()
    agent_s: dict[str, list[float]] = collections.defaultdict(list)
    per_minute: dict[str, list[float]] = collections.defaultdict(list)
    endings: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp:
        root = Path(tmp)
        tasks = root / "tasks"
        shutil.copytree(ROOT / "examples" / "tasks" / "write-done", tasks / "write-done")
        proc, url, key = start_replica(args.model.resolve(), root)
        try:
            # Untimed: a replica's first requests are slow (its first batches are compiled), whoever sends them.
            (root / "warm-up").mkdir()
            warm = config_file(root / "warm-up", args.model.resolve(), tasks, "terminal", args.trials)
            asyncio.run(trials_of(root / "warm-up", url, key, warm))
            for round_ in range(args.rounds):
                turn = round_ % len(SCAFFOLDS)
                order = SCAFFOLDS[turn:] + SCAFFOLDS[:turn]
                for scaffold in order:
                    folder = root / f"{scaffold}-{round_}"
                    folder.mkdir()
                    config = config_file(folder, args.model.resolve(), tasks, scaffold, args.trials)
                    began = time.monotonic()
                    records = asyncio.run(trials_of(folder, url, key, config))
                    wall = time.monotonic() - began
                    per_minute[scaffold].append(60 * len(records) / wall)
                    agent_s[scaffold] += [r["durations_s"]["agent_execution"] for r in records]
                    endings[scaffold].update(r["termination_reason"] for r in records)
                    print(f"round {round_} {scaffold:<8} {len(records)} trials in {wall:5.1f} s")
        finally:
            stop_group(proc.pid, grace_s=30)
            proc.wait()
    base_agent, base_rate = statistics.median(agent_s["terminal"]), statistics.median(per_minute["terminal"])
    print("== agents (local backend, tiny model, this machine)")
    print(f"{'scaffold':<9} {'agent phase s':>13} {'trials/min':>10} {'agent ratio':>11} {'rate ratio':>10}  endings")
    for scaffold in SCAFFOLDS:
        agent, rate = statistics.median(agent_s[scaffold]), statistics.median(per_minute[scaffold])
        ended = ", ".join(f"{k} {v}" for k, v in sorted(endings[scaffold].items()))
        print(f"{scaffold:<9} {agent:13.2f} {rate:10.1f} {agent / base_agent:11.2f} {rate / base_rate:10.2f}  {ended}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
