"""The sandbox service over a real bus: trials and sandboxes on request, team caps, and the reaper after a crash."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runctl.bus import Bus
from runctl.subjects import health_subject
from services.sandbox.backends.base import SandboxError
from services.sandbox.backends.docker_backend import DockerBackend
from services.sandbox.backends.local_backend import LocalBackend, kill_cgroup
from services.sandbox.bus_client import SandboxBusClient
from services.sandbox.ledger import SandboxLedger
from tests.conftest import ROOT, Services, async_wait_until, own_cgroup_parent

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
TASKS = ROOT / "tests" / "data" / "tasks"


@pytest.fixture
def scope(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A scope of its own for each test's sandboxes, and a parent cgroup removed at the end."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("RUNCTL_SANDBOX_SCOPE", name)
    monkeypatch.setenv("RUNCTL_SANDBOX_CGROUP", f"{own_cgroup_parent()}-{name}")
    yield name
    for controller in ("memory", "pids", "cpu"):
        folder = Path("/sys/fs/cgroup") / controller / os.environ["RUNCTL_SANDBOX_CGROUP"]
        if folder.is_dir():
            for child in [p for p in folder.iterdir() if p.is_dir()]:  # a failed test's leftovers
                kill_cgroup(child)
                child.rmdir()
            folder.rmdir()


@pytest.fixture(params=["local", "docker"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The backend the sandbox service serves (and the runner opens), on the real Docker Engine for docker."""
    if request.param == "docker":
        monkeypatch.setenv("DOCKER_HOST", request.getfixturevalue("docker_host"))
    monkeypatch.setenv("RUNCTL_SANDBOX_BACKENDS", request.param)
    return str(request.param)


@pytest.fixture
async def client(services: Services) -> AsyncIterator[SandboxBusClient]:
    bus = await Bus.connect(services.nats_url, name="test-sandbox-client")
    yield SandboxBusClient(bus)
    await bus.close()


def slow_task(tmp_path: Path, seconds: int = 100) -> Path:
    folder = tmp_path / "slow"
    shutil.copytree(TASKS / "hello", folder)
    toml = (folder / "task.toml").read_text().replace("timeout_sec = 60", f"timeout_sec = {seconds + 20}")
    (folder / "task.toml").write_text(toml)
    (folder / "solution" / "solve.sh").write_text(f"#!/bin/sh\nsleep {seconds}\n")
    return folder


async def test_trials_and_sandboxes_on_request(
    scope: str, services: Services, client: SandboxBusClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RUNCTL_SANDBOX_BACKENDS", "local")
    await asyncio.to_thread(services.start, "sandbox")
    result = await client.trial("nlp", TASKS / "hello", tmp_path / "t1", agent="oracle", run_id="r-1", trial="0")
    assert result.reward == 1.0 and (tmp_path / "t1" / "result.json").is_file()
    sandbox = await client.create("nlp", TASKS / "hello", run_id="r-1", trial="1")
    done = await client.exec(sandbox, "echo hi > /app/x; cat /app/x; exit 3", 10)
    assert (done.exit_code, done.stdout) == (3, "hi\n")
    timed = await client.exec(sandbox, "sleep 30", 0.5)
    assert timed.timed_out
    # Files both ways, over the bus in chunks: more than one chunk (512 KiB) each way.
    payload = tmp_path / "payload"
    (payload / "sub").mkdir(parents=True)
    (payload / "sub" / "big.bin").write_bytes(os.urandom(1_300_000))
    (payload / "run.sh").write_text("echo ran\n")
    await client.upload(sandbox, payload, "/app/payload")
    check = await client.exec(sandbox, "sh /app/payload/run.sh; wc -c < /app/payload/sub/big.bin", 10)
    assert check.stdout.split() == ["ran", "1300000"]
    await client.exec(sandbox, "cp -r /app/payload /logs/artifacts/copy", 10)
    assert await client.download(sandbox, "/logs/artifacts/copy", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "big.bin").read_bytes() == (payload / "sub" / "big.bin").read_bytes()
    assert not await client.download(sandbox, "/logs/nothing", tmp_path / "none")
    await client.destroy(sandbox)
    with pytest.raises(SandboxError, match="not held"):
        await client.exec(sandbox, "true", 5)
    with pytest.raises(SandboxError, match="not served"):
        await client.create("nlp", TASKS / "hello", backend="kubernetes")
    ledger = await SandboxLedger.open(client.bus)
    assert await ledger.entries() == {}


async def test_a_team_over_its_cap_waits_or_is_refused(
    scope: str, services: Services, client: SandboxBusClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCTL_SANDBOX_BACKENDS", "local")
    monkeypatch.setenv("RUNCTL_SANDBOX_CAPS", "nlp=2")
    await asyncio.to_thread(services.start, "sandbox")
    held = [await client.create("nlp", TASKS / "hello") for _ in range(2)]
    with pytest.raises(SandboxError, match="team nlp holds 2 sandboxes, its cap is 2"):
        await client.create("nlp", TASKS / "hello")
    other = await client.create("vision", TASKS / "hello")  # another team's cap is its own
    waiting = asyncio.create_task(client.create("nlp", TASKS / "hello", wait_s=20))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await client.destroy(held[0])
    third = await asyncio.wait_for(waiting, 20)
    for sandbox in (held[1], other, third):
        await client.destroy(sandbox)


async def test_concurrent_creates_never_pass_the_cap_and_every_seat_is_given_back(
    scope: str, services: Services, client: SandboxBusClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RUNCTL_SANDBOX_BACKENDS", "local")
    monkeypatch.setenv("RUNCTL_SANDBOX_CAPS", "nlp=2")
    await asyncio.to_thread(services.start, "sandbox")
    # Six creates at once, none willing to wait: counting sandboxes before recording them let them all through.
    results = await asyncio.gather(*(client.create("nlp", TASKS / "hello") for _ in range(6)), return_exceptions=True)
    made = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, SandboxError)]
    assert (len(made), len(refused)) == (2, 4), results
    assert all("its cap is 2" in e.message for e in refused)
    ledger = await SandboxLedger.open(client.bus)
    assert len(await ledger.seats("nlp")) == 2
    for sandbox in made:
        await client.destroy(sandbox)
    assert await ledger.seats("nlp") == [] and await ledger.entries() == {}
    # A trial takes a seat for its sandbox and gives it back.
    result = await client.trial("nlp", TASKS / "hello", tmp_path / "t", agent="oracle")
    assert result.reward == 1.0 and await ledger.seats() == []


async def test_a_warm_sandbox_is_handed_out_and_the_pool_refills(
    scope: str, services: Services, client: SandboxBusClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCTL_SANDBOX_BACKENDS", "local")
    monkeypatch.setenv("RUNCTL_SANDBOX_WARM", "1")
    await asyncio.to_thread(services.start, "sandbox")
    first = await client.create("nlp", TASKS / "hello", run_id="r-w")
    assert not first.sandbox_id.startswith("warm-")  # the pool fills once a kind has been asked for

    async def warm_ready() -> bool:
        reply = await client.bus.nc.request(health_subject("sandbox"), b"", timeout=2)
        return bool(json.loads(reply.data)["warm"] == 1)

    await async_wait_until(warm_ready, 30, "one warm sandbox")
    second = await client.create("nlp", TASKS / "hello", run_id="r-w")
    assert second.sandbox_id.startswith("warm-")
    assert (await client.exec(second, "pwd", 10)).stdout == "/app\n"
    ledger = await SandboxLedger.open(client.bus)
    assert (await ledger.entries())[second.sandbox_id].run_id == "r-w"  # the ledger knows whose it is now
    await async_wait_until(warm_ready, 30, "the pool to refill")
    for sandbox in (first, second):
        await client.destroy(sandbox)
    await asyncio.to_thread(services.stop, "sandbox")  # a clean stop removes the warm one too
    assert not _owned("local", services, scope) and not await ledger.entries()


async def test_the_reaper_cleans_up_after_a_killed_service(
    scope: str, services: Services, client: SandboxBusClient, tmp_path: Path, backend: str
) -> None:
    await asyncio.to_thread(services.start, "sandbox")
    task = slow_task(tmp_path)
    trials = [
        asyncio.create_task(
            client.trial(
                "nlp", task, tmp_path / f"t{i}", backend=backend, run_id="r-crash", trial=str(i), timeout_s=300
            )
        )
        for i in range(8)
    ]
    ledger = await SandboxLedger.open(client.bus)

    async def eight_running() -> bool:  # made, not only recorded: the ledger has them before they exist
        return len(_owned(backend, services, scope)) == 8 and len(await ledger.entries()) == 8

    await async_wait_until(eight_running, 60, "8 sandboxes made and in the ledger")
    services.kill("sandbox")
    for trial in trials:
        trial.cancel()
    held = _owned(backend, services, scope)
    assert len(held) == 8  # the crash left them behind

    started = time.monotonic()
    await asyncio.to_thread(services.start, "sandbox")

    async def all_reaped() -> bool:
        transfers = list((services.home / "transfers").iterdir())  # the dead instance's folder goes too
        return not _owned(backend, services, scope) and not await ledger.entries() and len(transfers) == 1

    await async_wait_until(all_reaped, 30, "the reaper to remove every orphan, its ledger entry and transfers")
    assert time.monotonic() - started < 30
    table = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    assert not [line for line in table.splitlines() if str(services.home) in line and not line.lstrip().startswith("Z")]


# A runner as the local engine is one: its backend opened in its own process and booked in the ledger (what
# carry_in_process gives every submitted run), holding three sandboxes of team nlp's run r-killed, then waiting.
RUNNER = """
import asyncio, sys
from pathlib import Path
from runctl.bus import Bus
from runctl.tasks import load_task
from services.sandbox.booked import booked
from services.sandbox.library import open_backend
from services.sandbox.trial import sandbox_spec

async def main(backend_name, task_dir, ready):
    bus = await Bus.connect(None, as_team=False)
    published = []

    async def emit(payload, key):
        published.append(key)

    with open_backend(backend_name) as (backend, image_for):
        async with booked(backend, bus, "nlp", "r-killed", emit) as sandboxes:
            task = load_task(Path(task_dir))
            labels = {"runctl.team": "nlp", "runctl.run": "r-killed"}
            for i in range(3):
                spec = sandbox_spec(task, image_for(task), {**labels, "runctl.trial": f"hello/{i}"})
                await asyncio.to_thread(sandboxes.create, spec)
            Path(ready).write_text(" ".join(published))
            await asyncio.sleep(600)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_killed_runners_sandboxes_are_in_the_ledger_and_reaped_within_30_s(
    scope: str, services: Services, client: SandboxBusClient, tmp_path: Path, backend: str
) -> None:
    await asyncio.to_thread(services.start, "sandbox")
    ready = tmp_path / "ready"
    with (tmp_path / "runner.log").open("wb") as log:
        runner = subprocess.Popen(
            [sys.executable, "-c", RUNNER, backend, str(TASKS / "hello"), str(ready)],
            env=services.env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    ledger = await SandboxLedger.open(client.bus)
    try:
        await async_wait_until(lambda: ready.exists() or runner.poll() is not None, 120, "the runner's sandboxes")
        assert runner.poll() is None, (tmp_path / "runner.log").read_text()[-3000:]
        entries = await ledger.entries()
        assert len(_owned(backend, services, scope)) == 3 and len(entries) == 3
        assert {(e.team, e.run_id, e.owner.startswith("runner-")) for e in entries.values()} == {
            ("nlp", "r-killed", True)
        }
        assert len(await ledger.seats("nlp")) == 3  # counted against the team's cap with the service's own
        assert ready.read_text().count(".created") == 3  # each announced as an event of the run
        runner.kill()  # SIGKILL: no cleanup of its own
        runner.wait(10)
        killed = time.monotonic()
        assert len(_owned(backend, services, scope)) == 3

        async def reaped() -> bool:
            return not _owned(backend, services, scope) and not await ledger.entries() and not await ledger.seats()

        await async_wait_until(reaped, 30, "the reaper to remove the dead runner's sandboxes, entries and seats")
        print(f"a SIGKILLed runner's sandboxes were reaped {time.monotonic() - killed:.1f} s after it died")
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)


def _owned(backend: str, services: Services, scope: str) -> list[str]:
    if backend == "docker":
        docker = DockerBackend()
        try:
            return [o.sandbox_id for o in docker.list_owned({"runctl.scope": scope})]
        finally:
            docker.close()
    local = LocalBackend(root=services.home / "sandboxes")
    return [o.sandbox_id for o in local.list_owned({"runctl.scope": scope})]


class _GatedBackend:
    """A local backend whose warm-pool creates wait at a gate: a refill held in flight while the service stops."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.refill_started = threading.Event()
        self.gate = threading.Event()

    def create(self, spec: Any) -> Any:
        if spec.sandbox_id.startswith("warm-"):
            self.refill_started.set()
            self.gate.wait(60)
        return self.inner.create(spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_stopping_waits_for_a_refill_in_flight_then_removes_the_pool(
    scope: str, nats_server: Any, tmp_path: Path
) -> None:
    from runctl.service import ServiceRuntime
    from runctl.tasks import load_task
    from services.sandbox.service import SandboxService
    from services.sandbox.settings import SandboxSettings
    from services.sandbox.trial import sandbox_spec

    local = LocalBackend(root=tmp_path / "sandboxes", cgroup_parent=f"{own_cgroup_parent()}-{scope}")
    gated = _GatedBackend(local)
    runtime = ServiceRuntime("sandbox", nats_server.url)
    await runtime.start()
    settings = SandboxSettings(scope=scope, warm=1)
    service = SandboxService(runtime, {"local": (gated, local.task_root)}, settings)  # type: ignore[dict-item]
    await service.start()
    task = load_task(TASKS / "hello")
    first = await service.created(gated, sandbox_spec(task, local.task_root(task), {"runctl.team": "nlp"}))  # type: ignore[arg-type]
    await asyncio.to_thread(gated.refill_started.wait, 30)  # the pool's refill is now making a sandbox
    runtime.request_stop()
    stopping = asyncio.create_task(runtime.serve())  # the service's own shutdown: consumers, then service.stop
    await asyncio.sleep(0.5)
    assert not stopping.done(), "the service stopped with a refill still making a sandbox"
    gated.gate.set()
    await asyncio.wait_for(stopping, 60)
    assert local.list_owned() == [], "a warm sandbox outlived the service"
    assert first.sandbox_id not in service.live
