"""nats-server configured from the team registry (`runctl team nats-config`): a team publishes only as itself, and
submits and watches its runs with its token alone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runctl.bus import Bus
from runctl.errors import PublishError
from runctl.events import CancelRequested, RunAdmitted, new_event
from runctl.events.payloads import RUNS_STREAM
from runctl.sdk import RunctlClient
from runctl.stack import nats_server_binary
from runctl.subjects import team_stream
from tests.conftest import ROOT, Services, free_port, login_refused, wait_until

pytestmark = pytest.mark.integration

SECRETS = {"RUNCTL_SERVICES_PASSWORD": "svc-pw", "RUNCTL_ADMIN_PASSWORD": "admin-pw"}
RUNCTL = str(Path(sys.executable).parent / "runctl")


@dataclass
class Secured:
    port: int
    tokens: dict[str, str]


def _runctl(*args: str, nats_url: str, home: Path) -> str:
    env = {**os.environ, **SECRETS, "RUNCTL_NATS_URL": nats_url, "RUNCTL_HOME": str(home)}
    env.pop("RUNCTL_TOKEN", None)
    done = subprocess.run([RUNCTL, *args], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    """A nats-server configured as a shared cluster's is: first the services and the admin alone
    (``runctl team nats-config --bootstrap``), then the teams the admin added, from the registry, after a reload."""
    port = free_port()
    conf, home = tmp_path / "nats.conf", tmp_path / "home"
    admin = url(port, "admin", SECRETS["RUNCTL_ADMIN_PASSWORD"])
    where = ["--out", str(conf), "--listen", f"127.0.0.1:{port}", "--store", str(tmp_path / "js")]
    _runctl("team", "nats-config", "--bootstrap", *where, nats_url=admin, home=home)
    with (tmp_path / "nats.log").open("wb") as log:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(listening, 10, "the secured nats-server")
        tokens = {}
        for team in ("nlp", "vision"):
            added = _runctl("team", "add", team, "--gpus", "8", nats_url=admin, home=home)
            tokens[team] = added.split("RUNCTL_TOKEN=", 1)[1].split()[0]
        _runctl("team", "nats-config", *where, nats_url=admin, home=home)
        for reloads in (1, 2):  # twice, as deploy/nats/README.md says: the second wires the new accounts' imports
            proc.send_signal(signal.SIGHUP)
            wait_until(lambda n=reloads: _reloads(tmp_path / "nats.log") == n, 10, f"nats-server's reload {reloads}")
        wait_until(lambda: _can_log_in(port, tokens["nlp"]), 10, "nats-server to take the teams' users")
        yield Secured(port, tokens)
    finally:
        proc.terminate()
        proc.wait(10)


def _reloads(log: Path) -> int:
    return log.read_text(errors="replace").count("Reloaded server configuration")


def _can_log_in(port: int, token: str) -> bool:
    return asyncio.run(login_refused(url(port, "nlp", token))) == ""


def url(port: int, user: str, password: str) -> str:
    return f"nats://{user}:{password}@127.0.0.1:{port}"


def cancel_event(team: str):  # type: ignore[no-untyped-def]
    return new_event(CancelRequested(requested_by="t"), team=team, run_id="r-1", source="/test")


async def _publish_as(port: int, user: str, password: str, team: str, name: str = "cancel.requested") -> None:
    bus = await Bus.connect(url(port, user, password))
    try:
        if name == "cancel.requested":
            await bus.publish(cancel_event(team), timeout_s=1.0)
        else:
            await bus.publish(
                new_event(RunAdmitted(resources={}, quota_decision="t"), team=team, run_id="r-1", source="/t"),
                timeout_s=1,
            )
    finally:
        await bus.close()


def test_a_team_publishes_as_itself_and_not_as_another_team(secured: Secured) -> None:
    port, token = secured.port, secured.tokens["nlp"]

    async def go() -> dict[str, int]:
        services = await Bus.connect(url(port, "runctl", "svc-pw"))
        await services.ensure_streams(teams=["nlp", "vision"])
        await _publish_as(port, "nlp", token, "nlp")
        with pytest.raises(PublishError):
            await _publish_as(port, "nlp", token, "vision")
        with pytest.raises(PublishError):  # an event only the services write, even of its own run
            await _publish_as(port, "nlp", token, "nlp", "run.admitted")
        info = await services.js.stream_info(team_stream(RUNS_STREAM, "nlp"), subjects_filter="runctl.>")
        await services.close()
        return dict(info.state.subjects or {})

    assert asyncio.run(go()) == {"runctl.nlp.r-1.cancel.requested": 1}


# Three services' health waits (30 s each), the run, and the watch's trial grace.
@pytest.mark.timeout(600)
def test_a_team_user_can_submit_and_watch_its_run_to_the_end(
    secured: Secured, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    services = Services(url(secured.port, "runctl", "svc-pw"), home, free_port())
    try:
        for name in ("validator", "launcher", "tracker"):
            services.start(name)
        config = tmp_path / "run.env"
        config.write_text((ROOT / "configs" / "examples" / "preview.env").read_text().replace("TEAM=demo", "TEAM=nlp"))

        async def go() -> list[str]:
            # As a team member runs it: the token alone says who they are (user and password).
            monkeypatch.setenv("RUNCTL_TOKEN", secured.tokens["nlp"])
            async with RunctlClient(f"nats://127.0.0.1:{secured.port}", services.tracker_url) as client:
                run = await client.submit(config)
                # The end event is held until all its trials have come, or until none has for the grace:
                # the default 5 s can pass on a loaded host with trials still on their way.
                return [event.name async for event in client.watch(run.run_id, trial_grace_s=120)]

        names = asyncio.run(go())
        assert names[0] == "config.submitted" and names[-1] == "run.succeeded"
        assert names.count("trial.finished") == 32
    finally:
        services.stop_all()


def test_a_bus_configured_with_an_issuer_asks_the_launcher_for_team_and_run_logins(tmp_path: Path) -> None:
    """As a shared cluster's operators set it up (deploy/nats/README.md): `runctl team nats-config --issuer-seed`
    makes the key and the callout's configuration, with a system user; the launcher is given the key and the system
    login. A team added later takes a reload (the callout's block does not change), never a restart; its token logs
    in through the launcher, and a rotation closes the connection that used the old one. A run's login is taken
    once issued, with no edit of the configuration; a wrong password and a revoked login are refused."""
    port, seed = free_port(), tmp_path / "callout.seed"
    conf, home = tmp_path / "nats.conf", tmp_path / "home"
    home.mkdir()
    bus = f"nats://127.0.0.1:{port}"
    admin, services_url = url(port, "admin", "admin-pw"), url(port, "runctl", "svc-pw")
    where = ["--out", str(conf), "--listen", f"127.0.0.1:{port}", "--store", str(tmp_path / "js")]
    where += ["--issuer-seed", str(seed)]
    os.environ["RUNCTL_SYSTEM_PASSWORD"] = "sys-pw"  # _runctl passes the environment on
    try:
        _runctl("team", "nats-config", "--bootstrap", *where, nats_url=admin, home=home)
    finally:
        del os.environ["RUNCTL_SYSTEM_PASSWORD"]
    assert seed.stat().st_mode & 0o777 == 0o600 and seed.read_text().startswith("SA")
    with (tmp_path / "nats.log").open("wb") as log:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    launcher = Services(services_url, home, free_port())
    launcher.extra_env = {
        "RUNCTL_RUN_LOGINS": "1",
        "RUNCTL_RUN_LOGIN_SEED_FILE": str(seed),
        "RUNCTL_BUS_SYSTEM_URL": url(port, "system", "sys-pw"),
    }
    try:
        wait_until(lambda: asyncio.run(login_refused(services_url)) == "", 10, "the nats-server with a callout")
        launcher.start("launcher")
        token = _runctl("team", "add", "nlp", "--gpus", "8", nats_url=admin, home=home).split("RUNCTL_TOKEN=")[1]
        token = token.split()[0]
        os.environ["RUNCTL_SYSTEM_PASSWORD"] = "sys-pw"
        try:
            _runctl("team", "nats-config", *where, nats_url=admin, home=home)
        finally:
            del os.environ["RUNCTL_SYSTEM_PASSWORD"]
        for reloads in (1, 2):
            proc.send_signal(signal.SIGHUP)
            wait_until(lambda n=reloads: _reloads(tmp_path / "nats.log") == n, 10, f"nats-server's reload {reloads}")
        assert "Failed to reload" not in (tmp_path / "nats.log").read_text()

        async def go() -> dict[str, object]:
            from runctl import runlogins
            from runctl.subjects import health_subject

            services = await Bus.connect(services_url)
            seen: dict[str, object] = {}
            try:
                team = await Bus.connect(url(port, "nlp", token), reconnect=False)
                await services.ensure_streams(teams=["nlp"])
                await _publish_as(port, "nlp", token, "nlp")  # a team's submission path, through the callout
                login = await runlogins.issue(services, "nlp", "r-1")
                await runlogins.wait_accepted(bus, login, timeout_s=10)
                seen["run"] = await login_refused(bus, user=login.user, password=login.password)
                seen["wrong"] = await login_refused(bus, user=login.user, password="guess")
                await runlogins.revoke(services, "nlp", "r-1")
                seen["revoked"] = await login_refused(bus, user=login.user, password=login.password)
                rotated = _runctl("team", "rotate", "nlp", nats_url=admin, home=home).split("RUNCTL_TOKEN=")[1]
                for _ in range(100):
                    if team.nc.is_closed:
                        break
                    await asyncio.sleep(0.1)
                seen["old token's connection closed"] = team.nc.is_closed
                await team.close()
                seen["old token"] = await login_refused(url(port, "nlp", token))
                seen["new token"] = await login_refused(url(port, "nlp", rotated.split()[0]))
                health = json.loads((await services.nc.request(health_subject("launcher"), b"", timeout=5)).data)
                seen |= {k: v for k, v in health.items() if k.startswith("logins_")}
            finally:
                await services.close()
            return seen

        seen = asyncio.run(go())
        assert seen.pop("run") == "" and seen.pop("new token") == ""
        refused = {k: "Authorization" in str(seen.pop(k)) for k in ("wrong", "revoked", "old token")}
        assert refused == dict.fromkeys(refused, True)
        assert seen["old token's connection closed"] is True and seen["logins_cut"] == 1
    finally:
        launcher.stop_all()
        proc.terminate()
        proc.wait(10)
