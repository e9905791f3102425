"""What a run's own bus login costs a runner's start, and what its desk costs a request, on the embedded stack.

It starts the stack from a fresh temporary ``$RUNCTL_HOME`` on free loopback ports, then for ``--runs`` runs in
turn: issues a login (``runctl.runlogins.issue``), waits until the bus accepts it (the supervisor rewrites
``nats.conf`` and reloads nats-server), connects with it, and revokes it, timing issue → accepted and revoke →
refused. Against the same stack it times ``--requests`` reads of a run's ledger entry: straight from the bucket
with the services' login (what a runner did before), and through the launcher's desk with the run's login (what it
does now). Stops the stack with ``runctl down``.

    python bench/runlogins.py [--runs 10] [--requests 200]

Prints medians and p90s, and the desk/bucket ratio, measured in this run. Nothing of the project changes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def refused(url: str, user: str, password: str) -> bool:
    """Whether the bus turns this login away."""
    from nats.aio.client import Client

    async def quiet(error: Exception) -> None:
        pass

    nc = Client()
    try:
        await nc.connect(
            url, user=user, password=password, allow_reconnect=False, max_reconnect_attempts=0, error_cb=quiet
        )
    except Exception:
        with contextlib.suppress(Exception):
            await nc.close()
        return True
    await nc.close()
    return False


def runctl(home: Path, *args: str) -> None:
    env = {**os.environ, "RUNCTL_HOME": str(home)}
    env.pop("RUNCTL_TOKEN", None)
    subprocess.run([RUNCTL, *args], env=env, check=True, capture_output=True, timeout=300, cwd=ROOT)


def summary(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"{name}: median {statistics.median(ordered):.1f} ms, p90 {p90:.1f} ms (n={len(ordered)})"


async def measure(home: Path, runs: int, requests: int) -> list[str]:
    from runctl import runlogins
    from runctl.bus import Bus, desk
    from runctl.home import read_stack_state
    from runctl.natsauth import SERVICES_USER
    from runctl.stackbus import stack_logins
    from services.launcher.ledger import Ledger, LedgerEntry

    state, logins = read_stack_state(home), stack_logins(home)
    assert state is not None and logins is not None
    url = state.nats_url
    services = await Bus.connect(logins[SERVICES_USER].url(url), as_team=False)
    ledger = await Ledger.open(services)
    accepted, cut_off, direct, asked = [], [], [], []
    try:
        for i in range(runs):
            run_id = f"bench-run-{i}"
            await ledger.put(run_id, LedgerEntry(team="bench", state="active"))
            start = time.perf_counter()
            login = await runlogins.issue(services, "bench", run_id)
            await runlogins.wait_accepted(url, login)
            accepted.append((time.perf_counter() - start) * 1000)
            runner = await Bus.connect(login.url(url), as_team=False)
            if i == 0:  # the desk's cost, on the first run's login
                for _ in range(requests):
                    start = time.perf_counter()
                    await ledger.get(run_id)
                    direct.append((time.perf_counter() - start) * 1000)
                    start = time.perf_counter()
                    await desk.ask(runner, "ledger_get")
                    asked.append((time.perf_counter() - start) * 1000)
            await runner.close()
            start = time.perf_counter()
            await runlogins.revoke(services, "bench", run_id)
            while not await refused(url, login.user, login.password):
                await asyncio.sleep(0.02)
            cut_off.append((time.perf_counter() - start) * 1000)
            await ledger.put(run_id, LedgerEntry(team="bench", state="ended"))
    finally:
        await services.close()
    ratio = statistics.median(asked) / statistics.median(direct)
    return [
        summary("issue -> accepted by the bus", accepted),
        summary("revoke -> refused by the bus", cut_off),
        summary("ledger read, bucket (services' login)", direct),
        summary("ledger read, desk (run's login)", asked),
        f"desk/bucket median ratio: {ratio:.2f}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="runctl-bench-logins-"))
    try:
        runctl(home, "up", "--nats-port", str(free_port()), "--tracker-port", str(free_port()))
        try:
            lines = asyncio.run(measure(home, args.runs, args.requests))
        finally:
            runctl(home, "down")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print("== run logins (embedded stack)")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
