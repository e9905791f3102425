"""``SCAFFOLD=mswea``: mini-swe-agent inside the sandbox, from its bundle (``runctl agents build mswea``).

The bundle (``runctl.bundles``: its own CPython with mini-swe-agent and litellm, pinned) is bound read-only at
``/runctl/bundle``; the sandbox keeps its network off and reaches its proxy session through the installed agents'
relay (``installed.py``), on the bundle's Python. ``mswea_run.py`` starts mini-swe-agent's own agent on the
instruction with litellm's OpenAI-compatible provider pointed at the session (``openai/<served model>``,
``api_base`` = the session's ``/v1``), litellm's fetch of its price list turned off. How it ended maps to the
trial's termination reason:

========================  =================  ==============================================
mini-swe-agent's status   termination         why
========================  =================  ==============================================
``Submitted``             agent_completed     it ran ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
``LimitsExceeded``        max_turns           ``AGENT_MAX_ITERATIONS`` model calls (its step limit)
``TimeExceeded``          timeout             ``AGENT_TIMEOUT_SEC`` (its wall-time limit; the sandbox's own
                                              limit ends it too, a few seconds later)
``ContextWindowExceeded…``  overlong          the conversation outgrew the model's context
anything else             error               its own status and message (``RepeatedFormatError``: three
                                              answers in a row without one command block)
========================  =================  ==============================================
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from runctl.bundles import Bundle
from runctl.tasks import Task
from services.launcher.rollout.agents.bundled import Budget, BundledAgent
from services.launcher.rollout.agents.installed import AGENT_DIR_INSIDE, RELAY_PORT
from services.sandbox.library import AgentOutcome, Backend, Sandbox

OUTCOME = "/logs/agent/mswea.json"
ENDINGS = {"Submitted": "agent_completed", "LimitsExceeded": "max_turns", "TimeExceeded": "timeout"}


def outcome_of(ended: dict[str, Any] | None) -> AgentOutcome:
    """The trial's ending for what ``mswea_run.py`` wrote (None: it wrote nothing, so it crashed first)."""
    if ended is None:
        return AgentOutcome(
            "error", ("agent", "mini-swe-agent ended without saying how (see logs/agent/installed.txt)")
        )
    status, message = str(ended.get("exit_status") or ""), str(ended.get("message") or "")
    if status in ENDINGS:
        reason = ENDINGS[status]
        if reason == "agent_completed":
            return AgentOutcome("agent_completed")
        budget = "AGENT_MAX_ITERATIONS" if reason == "max_turns" else "AGENT_TIMEOUT_SEC"
        why = f"mini-swe-agent stopped at its limit ({budget}): {status}"
        return AgentOutcome(reason, ("agent_budget", why))  # type: ignore[arg-type]
    if "ContextWindowExceeded" in status:
        return AgentOutcome("overlong", ("agent_budget", f"mini-swe-agent: {status}: {message}"[:500]))
    return AgentOutcome("error", ("agent", f"mini-swe-agent: {status or 'no status'}: {message}"[:500]))


class MsweaAgent(BundledAgent):
    name = "mswea"
    outcome_file = OUTCOME

    def __init__(self, bundle: Bundle, session_path: str, model: str, socket_dir: Path, budget: Budget) -> None:
        self.given: dict[str, object] = {
            "base_url": f"http://127.0.0.1:{RELAY_PORT}{session_path}/v1",
            "model": model,
            "temperature": budget.temperature,
            "max_tokens": budget.max_tokens,
            "max_turns": budget.max_turns,
            "instruction": f"{AGENT_DIR_INSIDE}/instruction.md",
        }
        env = {
            # Offline and quiet: no price list from the network, no telemetry, no start-up banner or config dir.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/.mswea",
        }
        super().__init__(bundle, session_path, model, socket_dir, env)

    def setup(self, backend: Backend, sandbox: Sandbox, task: Task) -> None:
        super().setup(backend, sandbox, task)
        backend.upload(sandbox, Path(__file__).with_name("mswea_run.py"), f"{AGENT_DIR_INSIDE}/mswea_run.py")

    def run(self, backend: Backend, sandbox: Sandbox, task: Task, timeout_s: float) -> AgentOutcome:
        given = {**self.given, "timeout_s": max(1, int(timeout_s) - 5)}  # its own limit first, then the sandbox's
        driver = f"{self.python_command()} {AGENT_DIR_INSIDE}/mswea_run.py"
        self.command = f"{driver} {OUTCOME} {shlex.quote(json.dumps(given))}"
        return super().run(backend, sandbox, task, timeout_s)

    def outcome(self, ended: dict[str, Any] | None, exit_code: int) -> AgentOutcome:
        if ended is None and exit_code != 0:
            return AgentOutcome("error", ("agent", f"mini-swe-agent exited with code {exit_code} before it began"))
        return outcome_of(ended)
