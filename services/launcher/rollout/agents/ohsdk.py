"""``SCAFFOLD=ohsdk``: the OpenHands SDK's agent inside the sandbox, from its bundle (``runctl agents build ohsdk``).

The bundle (``runctl.bundles``: a copy of CPython 3.12, which the SDK needs, with ``openhands-sdk`` and
``openhands-tools`` pinned) is bound read-only at ``/runctl/bundle``; the sandbox keeps its network off and reaches
its proxy session through the installed agents' relay, on the bundle's Python. ``ohsdk_run.py`` runs the SDK's
``Agent`` with its shell tools (terminal as a plain subprocess, file editor, task tracker; no browser) in a
``Conversation`` on the task's working folder, its LLM litellm's OpenAI-compatible provider at the session's ``/v1``
with the run's context and response length as its limits and no retries of its own; the SDK's banner, its refusal
of contexts under 16,384 tokens (the validator counts the agent's own prompt against the served context instead:
``fit.scaffold_prompt``) and litellm's price-list fetch and telemetry are off. How it ended maps to the trial's
termination reason:

=========================================  ================  ============================================
the conversation                           termination       why
=========================================  ================  ============================================
``finished``                               agent_completed   the agent called ``finish``, or answered
                                                             without a tool
error ``MaxIterationsReached``             max_turns         ``AGENT_MAX_ITERATIONS`` iterations (its
                                                             ``max_iteration_per_run``)
an error about the context window          overlong          the conversation outgrew the model's context
anything else (``stuck``, an LLM error)    error             its status, error code and message
=========================================  ================  ============================================

``AGENT_TIMEOUT_SEC`` is the sandbox's limit on the command: the trial ends ``timeout`` and its processes are killed.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from runctl.bundles import OHSDK_ENV, Bundle
from runctl.tasks import Task
from services.launcher.rollout.agents.bundled import Budget, BundledAgent
from services.launcher.rollout.agents.installed import AGENT_DIR_INSIDE, RELAY_PORT
from services.sandbox.library import AgentOutcome, Backend, Sandbox

OUTCOME = "/logs/agent/ohsdk.json"
#: Words of an error that says the conversation does not fit the model's context.
CONTEXT_WORDS = ("contextwindowexceeded", "maximum context length", "context window")


def ohsdk_outcome(ended: dict[str, Any] | None, exit_code: int) -> AgentOutcome:
    """The trial's ending for what ``ohsdk_run.py`` wrote (None: it wrote nothing, so it crashed first)."""
    if ended is None:
        return AgentOutcome(
            "error", ("agent", f"the OpenHands SDK's agent exited with code {exit_code} before it began")
        )
    status, code, message = (str(ended.get(key) or "") for key in ("status", "code", "message"))
    if status == "finished":
        return AgentOutcome("agent_completed")
    why = f"OpenHands SDK ({status}{', ' + code if code else ''}): {message or 'no message'}"[:500]
    if code == "MaxIterationsReached":
        return AgentOutcome("max_turns", ("agent_budget", why))
    if any(words in f"{code} {message}".lower() for words in CONTEXT_WORDS):
        return AgentOutcome("overlong", ("agent_budget", why))
    return AgentOutcome("error", ("agent", why))


class OpenHandsSdkAgent(BundledAgent):
    name = "ohsdk"
    outcome_file = OUTCOME

    def __init__(self, bundle: Bundle, session_path: str, model: str, socket_dir: Path, budget: Budget) -> None:
        given = {
            "base_url": f"http://127.0.0.1:{RELAY_PORT}{session_path}/v1",
            "model": model,
            "temperature": budget.temperature,
            "max_tokens": budget.max_tokens,
            "max_context_tokens": budget.max_context_tokens,
            "max_turns": budget.max_turns,
            "instruction": f"{AGENT_DIR_INSIDE}/instruction.md",
        }
        super().__init__(bundle, session_path, model, socket_dir, dict(OHSDK_ENV))
        driver = f"{self.python_command()} {AGENT_DIR_INSIDE}/ohsdk_run.py"
        self.command = f"{driver} {OUTCOME} {shlex.quote(json.dumps(given))}"

    def setup(self, backend: Backend, sandbox: Sandbox, task: Task) -> None:
        super().setup(backend, sandbox, task)
        backend.upload(sandbox, Path(__file__).with_name("ohsdk_run.py"), f"{AGENT_DIR_INSIDE}/ohsdk_run.py")

    def outcome(self, ended: dict[str, Any] | None, exit_code: int) -> AgentOutcome:
        return ohsdk_outcome(ended, exit_code)
