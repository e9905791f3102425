"""What a run's own bus login costs a runner's start, and what its desk costs a request, on the embedded stack.

It starts the stack from a fresh temporary ``$RUNCTL_HOME`` on free loopback ports, then for ``--runs`` runs in
turn: issues a login (``runctl.runlogins.issue``), waits until the bus accepts it (the supervisor rewrites
``nats.conf`` and reloads nats-server), connects with it, and revokes it, timing issue → accepted and revoke →
refused. Against the same stack it times ``--requests`` reads of a run's ledger entry: straight from the bucket
with the services' login (what a runner did before), and through the launcher's desk with the run's login (what it
does now). Stops the stack with ``runctl down``.

Then the same issue → accepted and revoke → refused against a nats-server configured as a shared cluster's is with
``runctl team nats-config --issuer-seed`` (its own temporary folder and port), whose logins the launcher's auth
callout (``runctl.callout``, run here in-process with a system login) answers from the bucket, plus revoke → the
connection closed; and prints the configured/callout ratio of issue → accepted.

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


async def measure(home: Path, runs: int, requests: int) -> tuple[list[str], float]:
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
    lines = [
        summary("issue -> accepted by the bus", accepted),
        summary("revoke -> refused by the bus", cut_off),
        summary("ledger read, bucket (services' login)", direct),
        summary("ledger read, desk (run's login)", asked),
        f"desk/bucket median ratio: {ratio:.2f}",
    ]
    return lines, statistics.median(accepted)


async def measure_callout(folder: Path, runs: int) -> tuple[list[str], float]:
    """issue -> accepted, revoke -> refused and revoke -> connection closed on a bus that asks the launcher."""
    from runctl import runlogins
    from runctl.bus import Bus
    from runctl.callout import LoginCallout
    from runctl.natsauth import ADMIN_USER, SERVICES_USER, SYSTEM_USER, NatsUser, nats_hash, server_config
    from runctl.natsjwt import NKey
    from runctl.stack import nats_server_binary
    from runctl.stackbus import write_private

    port, issuer = free_port(), NKey.create()
    users = {name: NatsUser(name, nats_hash(f"{name}-pw")) for name in (SERVICES_USER, ADMIN_USER, SYSTEM_USER)}
    text = server_config(
        f"127.0.0.1:{port}",
        str(folder / "js"),
        users[SERVICES_USER],
        users[ADMIN_USER],
        [],
        callout_issuer=issuer.public,
        system=users[SYSTEM_USER],
    )
    write_private(folder / "nats.conf", text)
    with (folder / "nats.log").open("wb") as log:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(folder / "nats.conf")], stdout=log, stderr=log)
    url = f"nats://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                services = await Bus.connect(f"nats://{SERVICES_USER}:{SERVICES_USER}-pw@127.0.0.1:{port}")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        from nats.aio.client import Client

        system = Client()
        await system.connect(f"nats://{SYSTEM_USER}:{SYSTEM_USER}-pw@127.0.0.1:{port}")
        callout = LoginCallout(services, issuer, system)
        await callout.start()
        accepted, cut_off, closed = [], [], []
        try:
            for i in range(runs):
                start = time.perf_counter()
                login = await runlogins.issue(services, "bench", f"bench-run-{i}")
                await runlogins.wait_accepted(url, login)
                accepted.append((time.perf_counter() - start) * 1000)
                runner = await Bus.connect(login.url(url), as_team=False, reconnect=False)
                start = time.perf_counter()
                await runlogins.revoke(services, "bench", f"bench-run-{i}")
                while not runner.nc.is_closed:
                    await asyncio.sleep(0.005)
                closed.append((time.perf_counter() - start) * 1000)
                await runner.close()
                start = time.perf_counter()
                while not await refused(url, login.user, login.password):
                    await asyncio.sleep(0.02)
                cut_off.append((time.perf_counter() - start) * 1000)
        finally:
            await callout.stop()
            await system.close()
            await services.close()
    finally:
        proc.terminate()
        proc.wait(10)
    lines = [
        summary("issue -> accepted by the bus", accepted),
        summary("revoke -> open connection closed", closed),
        summary("revoked -> refused by the bus (after the close)", cut_off),
    ]
    return lines, statistics.median(accepted)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="runctl-bench-logins-"))
    try:
        runctl(home, "up", "--nats-port", str(free_port()), "--tracker-port", str(free_port()))
        try:
            lines, configured = asyncio.run(measure(home, args.runs, args.requests))
        finally:
            runctl(home, "down")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print("== run logins (embedded stack)")
    for line in lines:
        print(line)
    folder = Path(tempfile.mkdtemp(prefix="runctl-bench-callout-"))
    try:
        callout_lines, callout_accepted = asyncio.run(measure_callout(folder, args.runs))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("== run logins (a bus configured with --issuer-seed: the launcher's auth callout)")
    for line in callout_lines:
        print(line)
    print(f"issue -> accepted, configured/callout median ratio: {configured / callout_accepted:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
