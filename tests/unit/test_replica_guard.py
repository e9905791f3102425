"""The key guard each replica loads (runctl/replica_guard/runctl_replica_guard.py), as an ASGI app."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runctl.replica_guard.runctl_replica_guard import RequireKey


def call(guard: RequireKey, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, list[Any]]:
    """The status the guard answers with (200: it handed the request to vLLM) and what it sent."""
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    guard.app = app
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    asyncio.run(guard(scope, receive, send))
    assert (sent[0]["status"] == 200) == bool(reached)
    return sent[0]["status"], sent


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> RequireKey:
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    return RequireKey(app=None)  # type: ignore[arg-type]


def test_only_health_answers_without_the_key(guard: RequireKey) -> None:
    assert call(guard, "GET", "/health", [])[0] == 200
    guarded = [("POST", "/collective_rpc"), ("POST", "/reset_prefix_cache"), ("POST", "/sleep"), ("POST", "/pause"),
               ("GET", "/metrics"), ("POST", "/tokenize"), ("POST", "/v1/completions"), ("GET", "/health/"),
               ("HEAD", "/health"), ("GET", "//health"), ("OPTIONS", "/v1/models")]  # fmt: skip
    for method, path in guarded:
        status, sent = call(guard, method, path, [])
        assert status == 401, (method, path)
        assert b"replica key" in sent[1]["body"]


def test_the_key_must_be_the_one_bearer_token(guard: RequireKey) -> None:
    right = (b"authorization", b"Bearer s3cret")
    assert call(guard, "POST", "/collective_rpc", [right])[0] == 200
    assert call(guard, "POST", "/collective_rpc", [(b"Authorization", b"bearer s3cret")])[0] == 200
    for headers in ([(b"authorization", b"Bearer s3cre")], [(b"authorization", b"Basic s3cret")],
                    [(b"authorization", b"s3cret")], [(b"x-api-key", b"s3cret")],
                    [(b"authorization", b"Bearer wrong"), right]):  # fmt: skip
        assert call(guard, "POST", "/collective_rpc", headers)[0] == 401, headers


def test_a_replica_without_a_key_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is not set"):
        RequireKey(app=None)  # type: ignore[arg-type]
