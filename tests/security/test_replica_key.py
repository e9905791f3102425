"""A run's vLLM replica answers only its own run: every path but ``GET /health`` demands the run's replica key
(runctl/replica_guard/runctl_replica_guard.py). Before, any process that reached the replica's port — on
the runner's machine, or a sandbox sharing its network — could load weights from any folder into the policy
(``/collective_rpc``, which a train run's replicas open), put it to sleep or pause it, and generate with it.

Attacked over HTTP on the worker's replica, started as a train run's (dev mode, the guard, a key of its own), with no
key and a wrong one; the victim is checked with the key afterwards: awake, not paused, and serving exactly the
completion it served before."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.infra import vllm_server as vllm_infra

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.skipif(bool(vllm_infra.why_unavailable()), reason=str(vllm_infra.why_unavailable())),
]

RELOAD = {"method": "reload_weights", "kwargs": {"weights_path": "/tmp/runctl-attacker-weights"}}
CHAT = {"model": vllm_infra.SERVED_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ATTACKS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/collective_rpc", RELOAD),  # the policy's weights, from the attacker's folder
    ("POST", "/sleep", None),  # the policy put to sleep: every trial of the run waits
    ("POST", "/pause", None),
    ("POST", "/reset_prefix_cache", None),
    ("POST", "/v1/chat/completions", CHAT),  # the run's replica generating for someone else
    ("GET", "/metrics", None),
]


def greedy(server: vllm_infra.VLLMServer) -> list[int]:
    body = {"model": vllm_infra.SERVED_NAME, "prompt": "Write done into", "max_tokens": 4, "temperature": 0,
            "return_token_ids": True, "seed": 0}  # fmt: skip
    reply = httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers, timeout=60)
    assert reply.status_code == 200, reply.text[:300]
    return list(reply.json()["choices"][0]["token_ids"])


@pytest.mark.timeout(600)  # the worker's replica may start with this test (vllm_server.START_TIMEOUT_S)
@pytest.mark.parametrize("key", [None, "wrong-key"])
@pytest.mark.parametrize(("method", "path", "body"), ATTACKS)
def test_a_runs_replica_refuses_a_caller_without_the_runs_key(
    served_model: vllm_infra.VLLMServer, key: str | None, method: str, path: str, body: dict[str, Any] | None
) -> None:
    before = greedy(served_model)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answer = httpx.request(method, served_model.url + path, headers=headers, json=body, timeout=30)
    assert answer.status_code == 401, (answer.status_code, answer.text[:300])
    # The victim, asked with its key: awake, not paused, serving what it served before.
    sleeping = httpx.get(f"{served_model.url}/is_sleeping", headers=served_model.headers, timeout=30)
    assert sleeping.status_code == 200 and sleeping.json() == {"is_sleeping": False}
    assert greedy(served_model) == before
    # Its liveness probe stays open: it tells nothing.
    assert httpx.get(f"{served_model.url}/health", timeout=30).status_code == 200
