"""How long ``runctl up`` takes, and what a team's login to its bus costs, on a quiet machine and on a loaded one.

A loaded machine is this one with ``--load`` processes spinning on the CPU (default 8: load 8 on two cores), started
by this script and stopped by their PIDs. For each of ``--repeat`` rounds, quiet then loaded, it starts the embedded
stack from a fresh temporary ``$RUNCTL_HOME`` on free loopback ports and times ``runctl up`` until it returns (every
service answering), then adds a team (``runctl team add``, which returns once the bus has taken the team's account)
and times ``--logins`` connections with the team's token, and stops the stack with ``runctl down``.

    python bench/up.py [--load 8] [--repeat 2] [--logins 50]

Prints the medians and the loaded/quiet ratios, measured in this run. Nothing of the project changes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNCTL = str(Path(sys.executable).parent / "runctl")
SPIN = "while True: pass"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def runctl(home: Path, *args: str, timeout: float = 300) -> str:
    env = {**os.environ, "RUNCTL_HOME": str(home)}
    env.pop("RUNCTL_TOKEN", None)
    done = subprocess.run([RUNCTL, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"runctl {' '.join(args)} failed: {done.stderr[-2000:]}")
    return done.stdout


async def login_ms(url: str, token: str, count: int) -> float:
    import nats

    team = token.removeprefix("rct_").split(".", 1)[0]
    took = []
    for _ in range(count):
        start = time.perf_counter()
        nc = await nats.connect(url, user=team, password=token, allow_reconnect=False)
        took.append((time.perf_counter() - start) * 1000)
        await nc.close()
    return statistics.median(took)


def one_round(logins: int) -> tuple[float, float]:
    home = Path(tempfile.mkdtemp(prefix="runctl-bench-up-"))
    nats_port, tracker_port = free_port(), free_port()
    try:
        start = time.monotonic()
        runctl(home, "up", "--nats-port", str(nats_port), "--tracker-port", str(tracker_port), "--timeout", "240")
        up_s = time.monotonic() - start
        try:
            added = runctl(home, "team", "add", "bench")
            token = added.split("RUNCTL_TOKEN=", 1)[1].split()[0]
            login = asyncio.run(login_ms(f"nats://127.0.0.1:{nats_port}", token, logins))
        finally:
            runctl(home, "down")
        return up_s, login
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", type=int, default=8, help="processes spinning during the loaded rounds")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each kind")
    parser.add_argument("--logins", type=int, default=50, help="team logins timed per round")
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"quiet": [], "loaded": []}
    for _ in range(args.repeat):
        results["quiet"].append(one_round(args.logins))
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.load)]
        try:
            results["loaded"].append(one_round(args.logins))
        finally:
            for proc in spinners:
                proc.kill()
                proc.wait()
    print(f"== runctl up and a team's login, {args.repeat} round(s) each; loaded = {args.load} spinning processes")
    medians = {}
    for kind, rounds in results.items():
        up = statistics.median(r[0] for r in rounds)
        login = statistics.median(r[1] for r in rounds)
        medians[kind] = (up, login)
        shown = ", ".join(f"{r[0]:.1f}" for r in rounds)
        print(f"   {kind:<7} runctl up {up:6.1f} s (rounds: {shown})   team login p50 {login:6.2f} ms")
    print(
        f"   loaded/quiet: runctl up {medians['loaded'][0] / medians['quiet'][0]:.2f}x, "
        f"login {medians['loaded'][1] / medians['quiet'][1]:.2f}x"
    )


if __name__ == "__main__":
    main()
