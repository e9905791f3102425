"""The team registry on a real nats-server: tokens shown once and kept only as hashes, quotas changed by
compare-and-set, and a rotated token cut off from the bus within seconds of nats-server reloading its users."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import bcrypt
import nats
import pytest

from runctl.bus import Bus
from runctl.bus.kv import bucket_keys
from runctl.natsauth import SERVICES_USER, NatsUser, nats_hash, server_config
from runctl.stack import nats_server_binary
from runctl.teams import BUCKET, MIB, TeamError, TeamRegistry
from runctl.tokens import token_digest
from tests.conftest import ROOT, NatsServer, free_port, login_refused, wait_until

pytestmark = pytest.mark.integration
RUNCTL = str(Path(sys.executable).parent / "runctl")


async def test_a_token_is_shown_once_kept_as_hashes_and_checked(nats_server: NatsServer) -> None:
    bus = await Bus.connect(nats_server.url)
    try:
        registry = TeamRegistry(bus)
        team, token = await registry.add("nlp", gpus=16, cpus=64, sandboxes=32, weight=2)
        assert token.startswith("rct_") and len(token) - 4 >= 43  # 256 random bits, URL-safe
        stored = [(await (await bus.js.key_value(BUCKET)).get(k)).value for k in await bucket_keys(bus.js, BUCKET)]
        assert stored and all(token.encode() not in (value or b"") for value in stored)
        assert team.token_sha256 == token_digest(token) and bcrypt.checkpw(token.encode(), team.nats_bcrypt.encode())
        assert team.nats_bcrypt.startswith("$2b$04$")  # bcrypt's least cost: the token is 256 random bits
        assert (await registry.by_token(token)) == team and await registry.by_token(token[:-1] + "x") is None
        with pytest.raises(TeamError, match="exists already"):
            await registry.add("nlp", 1, 1, 1, 1)
        with pytest.raises(TeamError, match="cannot be a team name"):
            await registry.add("Admin", 1, 1, 1, 1)
        changed = await registry.update("nlp", gpus=8, weight=3)
        assert (changed.gpus, changed.weight, changed.sandboxes) == (8, 3, 32)
        with pytest.raises(TeamError, match="weight must be above 0"):
            await registry.update("nlp", weight=0)
        with pytest.raises(TeamError, match="cannot be negative.*gpus=-1"):
            await registry.update("nlp", gpus=-1)
        # A quota removed (inf), or never given, is none: the cluster's size is the bound.
        freed = await registry.update("nlp", gpus=math.inf)
        assert freed.gpus is None and freed.limits() == (math.inf, 64, 32)
        plain, _ = await registry.add("speech")
        assert (plain.gpus, plain.cpus, plain.sandboxes, plain.weight) == (None, None, None, 1.0)
        rotated, new = await registry.rotate("nlp")
        assert not rotated.accepts(token) and rotated.accepts(new) and await registry.by_token(token) is None
        await registry.remove("nlp")
        assert await registry.get("nlp") is None and await registry.by_token(new) is None
        with pytest.raises(TeamError, match="no team 'nlp'"):
            await registry.rotate("nlp")
    finally:
        await bus.close()


async def test_a_teams_storage_bounds_its_streams_and_is_never_lowered_below_what_they_hold(
    nats_server: NatsServer,
) -> None:
    bus = await Bus.connect(nats_server.url)
    try:
        registry = TeamRegistry(bus)
        team, _ = await registry.add("storage", events_mb=1, trials_mb=2)
        runs, trials = [await bus.js.stream_info(f"{family}_storage") for family in ("RUNS", "TRIALS")]
        assert (runs.config.max_bytes, trials.config.max_bytes) == (MIB, 2 * MIB)
        assert team.nats_user().limits.storage_bytes == MIB  # its account's view of its events
        for wrong in (0, 1.5, math.inf, -3):
            with pytest.raises(TeamError, match="whole numbers, at least 1"):
                await registry.update("storage", events_mb=wrong)
        await registry.update("storage", events_mb=3)
        info = await bus.js.stream_info("RUNS_storage")
        assert info.config.max_bytes == 3 * MIB
        subject = info.config.subjects[0].replace("*", "r1")  # one of its runs' lifecycle subjects
        for _ in range(160):  # about 1.6 MiB of events recorded
            await bus.js.publish(subject, b"x" * 10_000)
        held = (await bus.js.stream_info("RUNS_storage")).state
        with pytest.raises(TeamError, match="holds 1.5 MiB of events.*at least 2"):
            await registry.update("storage", events_mb=1)
        after = await bus.js.stream_info("RUNS_storage")
        assert after.config.max_bytes == 3 * MIB and after.state.messages == held.messages == 160  # nothing dropped
        assert (await registry.get("storage")).events_mb == 3  # type: ignore[union-attr]
        assert (await registry.update("storage", events_mb=2)).stream_limits().runs_max_bytes == 2 * MIB
        assert (await bus.js.stream_info("RUNS_storage")).state.messages == 160
    finally:
        await bus.close()


def test_the_team_commands_print_the_token_once_and_never_list_it(nats_server: NatsServer, tmp_path: Path) -> None:
    env = {"RUNCTL_NATS_URL": nats_server.url, "RUNCTL_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}

    def runctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([RUNCTL, "team", *args], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)

    added = runctl("add", "vision", "--gpus", "8", "--sandboxes", "16", "--weight", "2", "--trials-mb", "96")
    assert added.returncode == 0, added.stderr
    (token,) = [line.split("=", 1)[1] for line in added.stdout.splitlines() if "RUNCTL_TOKEN=" in line]
    listed = runctl("list")
    assert "vision" in listed.stdout and token not in listed.stdout and "16" in listed.stdout
    assert "events MiB" in listed.stdout and " 256 " in listed.stdout and " 96" in listed.stdout
    assert runctl("set", "vision", "--gpus", "4").stdout.startswith("team vision: gpus 4, cpus -, sandboxes 16")
    assert runctl("set", "vision", "--sandboxes", "inf").stdout.startswith("team vision: gpus 4, cpus -, sandboxes -")
    stored = runctl("set", "vision", "--events-mb", "64")
    assert "events 64 MiB, trials 96 MiB" in stored.stdout, stored.stdout + stored.stderr
    refused = runctl("set", "vision", "--events-mb", "0")
    assert refused.returncode == 1 and "at least 1" in refused.stderr
    assert runctl("set", "vision", "--consumers", "8").stdout.rstrip().endswith("consumers 8")
    refused = runctl("set", "vision", "--consumers", "0")
    assert refused.returncode == 1 and "consumers as a count" in refused.stderr
    again = runctl("add", "vision")
    assert again.returncode == 1 and "exists already" in again.stderr and "runctl team set vision" in again.stderr
    rotated = runctl("rotate", "vision")
    assert "RUNCTL_TOKEN=" in rotated.stdout and token not in rotated.stdout
    assert runctl("remove", "vision").returncode == 0
    assert "no teams yet" in runctl("list").stdout


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def _slow_login(port: int, user: str, password: str, after_s: float) -> bytes:
    """Log in as a client held off the CPU for ``after_s`` between the server's greeting and its login would (a
    loaded machine's held one past nats-server's default 2 s): what the server answers the login's PING, or why
    the connection ended."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await reader.readline()  # INFO
        await asyncio.sleep(after_s)  # the stall under test, not a wait for a condition
        login = {"user": user, "pass": password, "verbose": False, "pedantic": False, "protocol": 1}
        writer.write(f"CONNECT {json.dumps(login)}\r\nPING\r\n".encode())
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), 10)).strip()
    except OSError as e:
        return str(e).encode()
    finally:
        writer.close()


async def test_a_rotated_token_is_cut_off_from_the_bus_within_seconds_of_the_reload(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    admin_bus = await Bus.connect(nats_server.url)
    registry = TeamRegistry(admin_bus)
    _, old = await registry.add("nlp", gpus=1, cpus=1, sandboxes=1, weight=1)
    services = NatsUser(SERVICES_USER, nats_hash("svc"))
    port, conf = free_port(), tmp_path / "secured.conf"

    async def write_config() -> None:
        users = [NatsUser(t.name, t.nats_bcrypt) for t in await registry.all()]
        conf.write_text(server_config(f"127.0.0.1:{port}", str(tmp_path / "js"), services, None, users))

    await write_config()
    with (tmp_path / "secured.log").open("wb") as log:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    disconnected = asyncio.Event()

    async def on_disconnect() -> None:
        disconnected.set()

    try:
        wait_until(lambda: _listening(port), 10, "the secured nats-server")
        url = f"nats://127.0.0.1:{port}"
        team = await nats.connect(url, user="nlp", password=old, allow_reconnect=False, disconnected_cb=on_disconnect)
        _, new = await registry.rotate("nlp")
        await write_config()
        rotated_at = time.monotonic()
        proc.send_signal(signal.SIGHUP)  # nats-server reloads its configuration
        await asyncio.wait_for(disconnected.wait(), 10)
        cut_after = time.monotonic() - rotated_at
        assert "Authorization" in await login_refused(url, user="nlp", password=old)
        fresh = await nats.connect(url, user="nlp", password=new)
        assert await _slow_login(port, "nlp", new, 3.0) == b"PONG"  # nats-server alone would close at 2 s
        await fresh.publish("runctl.nlp.r1.x", b"ok")
        await fresh.close()
        assert team.is_closed or not team.is_connected
        await team.close()
        print(f"the old token's connection was cut {cut_after:.2f}s after the reload")
    finally:
        proc.terminate()
        proc.wait(10)
        await admin_bus.close()


async def test_a_team_watches_its_own_run_with_its_token_and_sees_no_other_teams(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runctl.config import resolve_text
    from runctl.errors import BusError, RunctlError
    from runctl.events import RunQueued, RunSucceeded, new_event
    from runctl.sdk import RunctlClient

    admin_bus = await Bus.connect(nats_server.url)
    registry = TeamRegistry(admin_bus)
    _, token = await registry.add("nlp", gpus=1, cpus=1, sandboxes=1, weight=1)
    await registry.add("vision", gpus=1, cpus=1, sandboxes=1, weight=1)
    services = NatsUser(SERVICES_USER, nats_hash("svc"))
    port, conf = free_port(), tmp_path / "secured.conf"
    users = [NatsUser(t.name, t.nats_bcrypt) for t in await registry.all()]
    conf.write_text(server_config(f"127.0.0.1:{port}", str(tmp_path / "js"), services, None, users))
    with (tmp_path / "secured.log").open("wb") as log:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _listening(port), 10, "the secured nats-server")
        url = f"nats://127.0.0.1:{port}"
        svc = await Bus.connect(f"nats://{SERVICES_USER}:svc@127.0.0.1:{port}")
        await svc.ensure_streams()
        for team in ("vision", "nlp"):  # as the stack does once a team's account exists
            await svc.ensure_view(team)
        for team in ("vision", "nlp"):  # the same run id in two teams
            await svc.publish(new_event(RunQueued(position=0, reason=team), team=team, run_id="r1", source="t"))
            await svc.publish(new_event(RunSucceeded(), team=team, run_id="r1", source="t"))
        await svc.close()
        monkeypatch.setenv("RUNCTL_TOKEN", token)
        async with RunctlClient(nats_url=url) as client:
            seen = [e async for e in client.watch("r1", include_trials=False)]
        assert [(e.team, e.name) for e in seen] == [("nlp", "run.queued"), ("nlp", "run.succeeded")]
        preview = (ROOT / "configs" / "examples" / "preview.env").read_text()
        async with RunctlClient(nats_url=url) as client:
            submitted = await client.submit(resolve_text(preview + "TEAM=nlp\n", "preview.env", environ={}))
            assert submitted.team == "nlp"
            with pytest.raises(RunctlError, match="TEAM=vision but your token is team nlp's"):
                await client.submit(resolve_text(preview + "TEAM=vision\n", "preview.env", environ={}))
        monkeypatch.setenv("RUNCTL_TOKEN", "not-a-token")
        with pytest.raises(BusError, match="not a runctl team token"):
            await Bus.connect(url)
    finally:
        proc.terminate()
        proc.wait(10)
        await admin_bus.close()
