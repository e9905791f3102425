"""The built-in terminal agent (``SCAFFOLD=terminal``): a host-side loop that talks to the model through its trial's
proxy session and acts in the trial's sandbox.

Each turn it sends the conversation with one tool, ``bash``; every ``bash`` call the model makes is run in the
sandbox (as the task's agent user, with the time left) and its output, cut to ``OUTPUT_LIMIT`` characters, goes
back as the tool's result. It stops when the model answers without a tool call (``agent_completed``), after
``max_turns`` turns (``max_turns``), at its deadline (``timeout``), or when the conversation no longer fits the
context (``overlong``: vLLM refuses the prompt, or the tokens used pass ``max_context_tokens``). Every turn is
appended to ``agent/terminal.jsonl`` in the trial folder.

Sampling is seeded per call (from the task, the trial and the turn), so a run can be repeated call for call.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import httpx

from runctl.tasks import Task
from runctl.tinymodel import BASH_TOOL, TERMINAL_SYSTEM_PROMPT
from services.sandbox.library import AgentOutcome, Backend, Sandbox, SandboxError

SYSTEM_PROMPT = TERMINAL_SYSTEM_PROMPT
OUTPUT_LIMIT = 8000
COMMAND_TIMEOUT_S = 120.0
UNAVAILABLE_WAIT_S = 90.0
"""How long a call waits, retrying, while the proxy answers 503 (no replica up: one restarting, or its health
probes starved on a loaded host), before the trial gives up on the model."""
_OVERLONG_HINTS = ("maximum context length", "max_model_len", "context length", "too long", "max_tokens")


def trial_seed(task_id: str, trial: int) -> int:
    digest = hashlib.sha256(f"{task_id}\0{trial}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class TerminalAgent:
    name = "terminal"

    def __init__(
        self,
        base_url: str,
        model: str,
        log_dir: Path,
        *,
        max_turns: int,
        timeout_s: float,
        temperature: float,
        seed: int,
        max_tokens: int | None = None,
        max_context_tokens: int | None = None,
        http: httpx.Client | None = None,
        unavailable_wait_s: float = UNAVAILABLE_WAIT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.log_path = log_dir / "terminal.jsonl"
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.seed = seed
        self.max_tokens = max_tokens
        self.max_context_tokens = max_context_tokens
        self.unavailable_wait_s = unavailable_wait_s
        self.http = http  # shared by the trials of a run: making a client costs tens of milliseconds
        self.tokens = {"prompt": 0, "completion": 0}
        self.turns = 0
        self.model_seconds = 0.0
        self.model_unavailable = False
        """Set when the model could not be reached or failed (5xx): the trial says nothing about the agent."""

    def setup(self, backend: Backend, sandbox: Sandbox, task: Task) -> None:
        pass  # nothing to install: the loop runs on the host

    def run(self, backend: Backend, sandbox: Sandbox, task: Task, timeout_s: float) -> AgentOutcome:
        deadline = time.monotonic() + min(timeout_s, self.timeout_s)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.instruction.strip()},
        ]
        with contextlib.ExitStack() as stack:
            http = self.http or stack.enter_context(httpx.Client(timeout=None))
            log = stack.enter_context(self.log_path.open("a"))
            for turn in range(self.max_turns):
                left = deadline - time.monotonic()
                if left <= 0:
                    return AgentOutcome("timeout", ("agent_budget", f"the agent ran past {timeout_s:.0f} s"))
                reply = self._call(http, messages, turn, left)
                if isinstance(reply, AgentOutcome):
                    return reply
                self.turns += 1
                message = reply["choices"][0]["message"]
                calls = message.get("tool_calls") or []
                messages.append(
                    {"role": "assistant", "content": message.get("content"), **({"tool_calls": calls} if calls else {})}
                )
                record: dict[str, Any] = {"turn": turn, "content": message.get("content"), "tool_calls": []}
                usage = reply.get("usage") or {}
                for call in calls:
                    output = self._act(backend, sandbox, task, call, deadline)
                    record["tool_calls"].append({"arguments": call["function"].get("arguments"), "output": output})
                    messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": output})
                log.write(json.dumps(record) + "\n")
                log.flush()
                if not calls:
                    return AgentOutcome("agent_completed")
                used = int(usage.get("total_tokens", 0))
                if self.max_context_tokens and used >= self.max_context_tokens:
                    return AgentOutcome(
                        "overlong", ("agent_budget", f"{used} tokens used, the limit is {self.max_context_tokens}")
                    )
        return AgentOutcome("max_turns", ("agent_budget", f"no answer after {self.max_turns} turns"))

    def _call(
        self, http: httpx.Client, messages: list[dict[str, Any]], turn: int, left: float
    ) -> dict[str, Any] | AgentOutcome:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "tools": [BASH_TOOL],
            "temperature": self.temperature,
            "seed": (self.seed + turn) & 0x7FFFFFFF,
        }
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        started = time.monotonic()
        deadline, pause = started + left, 0.5
        try:
            while True:
                timeout = max(0.001, deadline - time.monotonic())
                response = http.post(f"{self.base_url}/chat/completions", json=body, timeout=timeout)
                waited = time.monotonic() - started
                if response.status_code != 503 or waited + pause > min(self.unavailable_wait_s, left):
                    break
                time.sleep(pause)
                pause = min(2 * pause, 10.0)
        except httpx.TimeoutException:
            return AgentOutcome("timeout", ("agent_budget", "the model call ran past the agent's deadline"))
        except httpx.HTTPError as e:
            self.model_unavailable = True
            return AgentOutcome("error", ("model", f"the model call failed: {type(e).__name__}: {e}"))
        finally:
            self.model_seconds += time.monotonic() - started
        if response.status_code == 400 and any(h in response.text.lower() for h in _OVERLONG_HINTS):
            return AgentOutcome("overlong", ("agent_budget", f"the context no longer fits: {response.text[:300]}"))
        if response.status_code != 200:
            self.model_unavailable = response.status_code >= 500
            return AgentOutcome("error", ("model", f"the model answered {response.status_code}: {response.text[:300]}"))
        reply: dict[str, Any] = response.json()
        usage = reply.get("usage") or {}
        self.tokens["prompt"] += int(usage.get("prompt_tokens", 0))
        self.tokens["completion"] += int(usage.get("completion_tokens", 0))
        return reply

    def _act(self, backend: Backend, sandbox: Sandbox, task: Task, call: dict[str, Any], deadline: float) -> str:
        function = call.get("function") or {}
        if function.get("name") != "bash":
            return f"error: there is no tool {function.get('name')!r}; the only tool is bash"
        try:
            arguments = json.loads(function.get("arguments") or "{}")
            command = arguments["command"]
            if not isinstance(command, str) or not command.strip():
                raise ValueError("command is empty")
        except (ValueError, KeyError, TypeError) as e:
            return f'error: bash needs arguments like {{"command": "ls"}} ({e})'
        left = max(1.0, min(COMMAND_TIMEOUT_S, deadline - time.monotonic()))
        try:
            result = backend.exec(sandbox, command, left, user=task.config.agent.user)
        except SandboxError as e:
            return f"error: the command could not run: {e.message}"
        output = (result.stdout + result.stderr)[-OUTPUT_LIMIT:]
        if result.timed_out:
            output += f"\n(the command was killed after {left:.0f} s)"
        return output if result.exit_code == 0 else f"{output}\n(exit code {result.exit_code})"
