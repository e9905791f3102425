"""The terminal agent's loop and its termination reasons, against a scripted model (httpx's mock transport) and a
sandbox that records the commands it is asked to run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from runctl.tasks import load_task
from services.launcher.rollout.agents.terminal import OUTPUT_LIMIT, SYSTEM_PROMPT, TerminalAgent, trial_seed
from services.sandbox.backends.base import ExecResult, Sandbox, SandboxSpec
from tests.conftest import ROOT

TASK = load_task(ROOT / "examples" / "tasks" / "write-done")
SANDBOX = Sandbox("s", "fake", "s", SandboxSpec("s", None))


class RecordingBackend:
    name = "fake"

    def __init__(self, output: str = "ok\n", exit_code: int = 0) -> None:
        self.commands: list[str] = []
        self.output = output
        self.exit_code = exit_code

    def exec(self, sandbox: Sandbox, command: str, timeout_s: float, **kwargs: Any) -> ExecResult:
        self.commands.append(command)
        return ExecResult(self.exit_code, self.output, "", False, 0.01)


def tool_call(command: str, n: int = 0) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {"id": f"call_{n}", "type": "function", "function": {"name": "bash", "arguments": arguments}}


def reply(content: str | None = None, calls: list[dict[str, Any]] | None = None, tokens: int = 30) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, "tool_calls": calls or []}
    usage = {"prompt_tokens": tokens - 5, "completion_tokens": 5, "total_tokens": tokens}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}


def agent(
    tmp_path: Path, answer: Callable[[dict[str, Any], int], httpx.Response], **options: Any
) -> tuple[TerminalAgent, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        return answer(body, len(seen) - 1)

    settings: dict[str, Any] = {"max_turns": 5, "timeout_s": 60, "temperature": 1.0, "seed": 7, **options}
    http = httpx.Client(transport=httpx.MockTransport(handler))
    return TerminalAgent("http://proxy/sess/t/v1", "tiny", tmp_path / "agent", http=http, **settings), seen


def test_it_runs_the_models_commands_and_stops_when_it_answers(tmp_path: Path) -> None:
    def answer(body: dict[str, Any], n: int) -> httpx.Response:
        if n == 0:
            return httpx.Response(200, json=reply(calls=[tool_call("echo done > answer.txt")]))
        return httpx.Response(200, json=reply("Done."))

    terminal, seen = agent(tmp_path, answer)
    backend = RecordingBackend(output="x" * (OUTPUT_LIMIT + 100))
    outcome = terminal.run(backend, SANDBOX, TASK, 60)  # type: ignore[arg-type]
    assert outcome.termination_reason == "agent_completed" and outcome.failure is None
    assert backend.commands == ["echo done > answer.txt"]
    first, second = seen
    assert first["messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Write done into answer.txt."},
    ]
    assert first["tools"][0]["function"]["name"] == "bash" and first["model"] == "tiny"
    assert (first["seed"], second["seed"]) == (7, 8) and first["temperature"] == 1.0
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_0"
    assert len(tool_message["content"]) == OUTPUT_LIMIT  # the command's output, cut to the limit
    assert terminal.turns == 2 and terminal.tokens == {"prompt": 50, "completion": 10}
    lines = (tmp_path / "agent" / "terminal.jsonl").read_text().splitlines()
    assert [json.loads(line)["turn"] for line in lines] == [0, 1]


def test_max_turns(tmp_path: Path) -> None:
    terminal, seen = agent(
        tmp_path, lambda body, n: httpx.Response(200, json=reply(calls=[tool_call("ls", n)])), max_turns=3
    )
    outcome = terminal.run(RecordingBackend(), SANDBOX, TASK, 60)  # type: ignore[arg-type]
    assert outcome.termination_reason == "max_turns" and len(seen) == 3


def test_overlong_when_vllm_refuses_the_prompt_or_the_budget_is_spent(tmp_path: Path) -> None:
    refused = httpx.Response(400, json={"error": {"message": "This model's maximum context length is 1024 tokens"}})
    terminal, _ = agent(tmp_path, lambda body, n: refused)
    assert terminal.run(RecordingBackend(), SANDBOX, TASK, 60).termination_reason == "overlong"  # type: ignore[arg-type]

    budget, _ = agent(
        tmp_path, lambda body, n: httpx.Response(200, json=reply(calls=[tool_call("ls")], tokens=900)),
        max_context_tokens=800,
    )  # fmt: skip
    outcome = budget.run(RecordingBackend(), SANDBOX, TASK, 60)  # type: ignore[arg-type]
    assert outcome.termination_reason == "overlong" and "900 tokens" in (outcome.failure or ("", ""))[1]


def test_timeout(tmp_path: Path) -> None:
    def slow(body: dict[str, Any], n: int) -> httpx.Response:
        time.sleep(0.3)
        return httpx.Response(200, json=reply(calls=[tool_call("ls", n)]))

    terminal, seen = agent(tmp_path, slow, timeout_s=0.5)
    outcome = terminal.run(RecordingBackend(), SANDBOX, TASK, 60)  # type: ignore[arg-type]
    assert outcome.termination_reason == "timeout" and 1 <= len(seen) <= 2


@pytest.mark.parametrize(
    ("response", "unavailable"),
    [(httpx.Response(503, text="no replica"), True), (httpx.Response(404, text="no such model"), False)],
)
def test_a_failed_model_call_is_an_error_and_says_whether_the_model_was_unavailable(
    tmp_path: Path, response: httpx.Response, unavailable: bool
) -> None:
    terminal, seen = agent(tmp_path, lambda body, n: response, unavailable_wait_s=1.0)
    outcome = terminal.run(RecordingBackend(), SANDBOX, TASK, 60)  # type: ignore[arg-type]
    assert outcome.termination_reason == "error" and outcome.failure is not None
    assert outcome.failure[0] == "model" and terminal.model_unavailable is unavailable
    assert len(seen) == (2 if unavailable else 1)  # a 503 is asked again (after 0.5 s) while the wait lasts


def test_a_model_that_is_unavailable_for_a_while_is_waited_for(tmp_path: Path) -> None:
    # The proxy answers 503 while no replica is up (one restarting, or its probes starved): the call is retried.
    def flaky(body: dict[str, Any], n: int) -> httpx.Response:
        return httpx.Response(503, text="no replica") if n < 2 else httpx.Response(200, json=reply("done"))

    terminal, seen = agent(tmp_path, flaky)
    outcome = terminal.run(RecordingBackend(), SANDBOX, TASK, 60)  # type: ignore[arg-type]
    assert outcome.termination_reason == "agent_completed" and len(seen) == 3 and not terminal.model_unavailable
    assert seen[0] == seen[2]  # the same call, seed included


def test_bad_tool_calls_are_answered_not_run(tmp_path: Path) -> None:
    calls = [
        {"id": "a", "type": "function", "function": {"name": "python", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "bash", "arguments": "not json"}},
    ]

    def answer(body: dict[str, Any], n: int) -> httpx.Response:
        return httpx.Response(200, json=reply(calls=calls) if n == 0 else reply("Done."))

    terminal, seen = agent(tmp_path, answer)
    backend = RecordingBackend()
    assert terminal.run(backend, SANDBOX, TASK, 60).termination_reason == "agent_completed"  # type: ignore[arg-type]
    assert backend.commands == []
    results = [m["content"] for m in seen[1]["messages"] if m["role"] == "tool"]
    assert "the only tool is bash" in results[0] and "bash needs arguments" in results[1]


def test_seeds_differ_between_trials_and_repeat_for_the_same_one() -> None:
    assert trial_seed("a", 0) == trial_seed("a", 0)
    assert len({trial_seed("a", k) for k in range(50)} | {trial_seed("b", 0)}) == 51
