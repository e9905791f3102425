"""The proxy as a process: the runctl service, ``runctl proxy serve``, and replicas discovered from Ray actors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, Services, async_wait_until, free_port
from tests.infra import ray_head
from tests.infra.fake_vllm import MODEL, FakeVLLM

pytestmark = pytest.mark.integration
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
async def fake() -> AsyncIterator[FakeVLLM]:
    upstream = await FakeVLLM().start()
    yield upstream
    await upstream.close()


async def one_session_round_trip(url: str, token: str) -> dict[str, object]:
    admin = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=30) as http:
        created = (await http.post(url + "/sessions", json={"metadata": {"trial": "t"}}, headers=admin)).json()
        reply = await http.post(created["openai_base_url"] + "/chat/completions", json=CHAT)
        assert reply.status_code == 200, reply.text
        closed = (await http.delete(f"{url}/sessions/{created['id']}", headers=admin)).json()
    return closed  # type: ignore[no-any-return]


async def test_the_service_serves_sessions_and_reports_its_url(
    services: Services, fake: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCTL_PROXY_UPSTREAMS", fake.url)
    await asyncio.to_thread(services.start, "proxy")
    record = json.loads((services.home / "proxy.json").read_text())
    assert oct((services.home / "proxy.json").stat().st_mode & 0o777) == "0o600"
    closed = await one_session_round_trip(record["url"], record["admin_token"])
    assert closed["turns"] == 1 and Path(str(closed["path"])).parent == services.home / "trajectories"
    assert Path(str(closed["path"])).exists()


def start_cli(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "runctl.cli.main", "proxy", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    url = token = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.match(r"runctl proxy listening on (\S+)", line):
            url = m.group(1)
        if m := re.match(r"admin token .*: (\S+)", line):
            token = m.group(1)
        if line.startswith("upstreams:"):
            break
    assert url, "the proxy did not print its URL"
    return proc, url, token


def stop(proc: subprocess.Popen[str]) -> int:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=30)  # reads the rest of the output and closes the pipe
    return proc.returncode


async def test_runctl_proxy_serve_writes_open_sessions_on_shutdown(fake: FakeVLLM, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RUNCTL_PROXY_ADMIN_TOKEN", None)
    proc, url, token = start_cli(["--upstream", fake.url, "--port", "0", "--trajectory-dir", str(tmp_path)], env)
    assert len(token) >= 32, "with no RUNCTL_PROXY_ADMIN_TOKEN, a generated token is printed"
    try:
        admin = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(timeout=30) as http:
            created = (await http.post(url + "/sessions", headers=admin)).json()
            assert (await http.post(created["openai_base_url"] + "/chat/completions", json=CHAT)).status_code == 200
    finally:
        code = await asyncio.to_thread(stop, proc)
    assert code == 0
    written = json.loads((tmp_path / f"{created['id']}.json").read_text())
    assert len(written["turns"]) == 1 and written["closed_at"]


async def test_replicas_are_discovered_from_ray_named_actors(fake: FakeVLLM, tmp_path: Path) -> None:
    reason = ray_head.why_unavailable()
    if reason:
        pytest.skip(reason)
    with ray_head.ray_head() as head:
        ray_head.start_server_actor(head, fake.server.port)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNCTL_PROXY_ADMIN_TOKEN": "adm"}
        proc, url, token = start_cli(
            ["--discover-ray", "--ray-address", head.gcs_address, "--port", str(free_port())], env
        )
        try:
            assert token == "", "a token chosen in the environment is not printed"

            async def discovered() -> bool:
                async with httpx.AsyncClient() as http:
                    replicas = (await http.get(url + "/replicas", headers={"authorization": "Bearer adm"})).json()[
                        "replicas"
                    ]
                return [(r["name"], r["url"], r["state"]) for r in replicas] == [
                    ("verl/vllm_server_0_0", fake.url, "up")
                ]

            await async_wait_until(discovered, 60, "the proxy to find the Ray actor's replica")
            closed = await one_session_round_trip(url, "adm")
            assert closed["turns"] == 1
        finally:
            assert await asyncio.to_thread(stop, proc) == 0
