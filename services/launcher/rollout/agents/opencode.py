"""``SCAFFOLD=oc``: OpenCode inside the sandbox, from its bundle (``runctl agents build oc``).

The bundle holds OpenCode's native executable (npm's platform package, installed without its install scripts; its
OpenAI-compatible provider is built in, so it fetches nothing on its first run) and a Python for the relay. OpenCode
runs headless on the instruction: ``opencode run --format json --pure --auto --title trial < instruction.md`` (JSON
events, no external plugins, its permission prompts answered yes, a title given so that it asks for none; the task's
words read from its standard input, as written: an argument would be quoted by OpenCode when it holds a space, and
one argument is limited to 128 KiB),
configured through ``OPENCODE_CONFIG_CONTENT``: one provider, ``runctl``, OpenAI-compatible, whose ``baseURL`` is the
trial's proxy session through the relay; the served model as its model, and as its small model (titles, summaries)
the proxy's side model, whose calls the session keeps out of the loss; the run's context and response length as their
limits (so its requests ask for no more than the model has); its own compaction off (on a
context overflow it would otherwise summarise and ask again, without end); its build agent's ``steps`` set to
``AGENT_MAX_ITERATIONS``. Its update checks, model-list fetch, LSP downloads and sharing are off, its state in the
sandbox's ``/tmp``. Its events (``/logs/agent/oc.jsonl``) map to the trial's ending:

===================================  ================  ====================================================
OpenCode's events                    termination       why
===================================  ================  ====================================================
an error ``ContextOverflowError``    overlong          the conversation outgrew the model's context
  (or one whose message says so)
any other error                      error             its own error name and message
``AGENT_MAX_ITERATIONS`` steps       max_turns         its step limit: at the last step OpenCode tells the
                                                       model to stop and answer without tools
a last step that finished ``stop``   agent_completed   it answered without asking for another tool
anything else, or no events          error             its exit code, or the reason its last step ended
===================================  ================  ====================================================

OpenCode's step limit is advice to the model, not a stop: a model that goes on calling tools past it is refused its
next turn by the trial's proxy session (which answers ``AGENT_MAX_ITERATIONS`` of the policy's calls), and the trial
ends ``max_turns``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from runctl.bundles import Bundle
from services.launcher.rollout.agents.bundled import Budget, BundledAgent
from services.launcher.rollout.agents.installed import AGENT_DIR_INSIDE, RELAY_PORT
from services.proxy.library import SIDE_MODEL
from services.sandbox.library import AgentOutcome, Backend, Sandbox

OUTCOME = "/logs/agent/oc.jsonl"
PROVIDER = "runctl"
#: Words of an error that says the conversation does not fit the model's context.
CONTEXT_WORDS = ("maximum context length", "context length", "context window", "too long")


def oc_config(base_url: str, model: str, max_turns: int, context: int | None, output: int | None) -> dict[str, Any]:
    """OpenCode's configuration for one trial (see the module's docstring)."""
    entry: dict[str, Any] = {"name": model}
    if context is not None:
        entry["limit"] = {"context": context, "output": output or context // 2}
    return {
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "runctl proxy session",
                "options": {"baseURL": base_url, "apiKey": "runctl-session"},
                "models": {model: entry, SIDE_MODEL: {**entry, "name": SIDE_MODEL}},
            }
        },
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{SIDE_MODEL}",  # titles and summaries: side turns, out of the loss
        "autoupdate": False,
        "share": "disabled",
        "compaction": {"auto": False},
        "agent": {"build": {"steps": max_turns}},
    }


def oc_outcome(events: list[dict[str, Any]], exit_code: int, max_turns: int) -> AgentOutcome:
    """The trial's ending for OpenCode's JSON events (empty: it printed none)."""
    errors = [e.get("error") or {} for e in events if e.get("type") == "error"]
    if errors:
        error = errors[-1]
        name = str(error.get("name") or "error")
        message = str((error.get("data") or {}).get("message") or error.get("message") or "no message")
        why = f"OpenCode ({name}): {message}"[:500]
        if name == "ContextOverflowError" or any(words in message.lower() for words in CONTEXT_WORDS):
            return AgentOutcome("overlong", ("agent_budget", why))
        return AgentOutcome("error", ("agent", why))
    steps = sum(1 for e in events if e.get("type") == "step_start")
    if steps >= max_turns:
        return AgentOutcome("max_turns", ("agent_budget", f"OpenCode took {steps} steps (AGENT_MAX_ITERATIONS)"))
    finishes = [e.get("part") or {} for e in events if e.get("type") == "step_finish"]
    if finishes and finishes[-1].get("reason") == "stop":
        return AgentOutcome("agent_completed")
    if not events:
        return AgentOutcome("error", ("agent", f"OpenCode exited with code {exit_code} without an event"))
    last = finishes[-1].get("reason") if finishes else "none"
    return AgentOutcome("error", ("agent", f"OpenCode exited with code {exit_code}; its last step ended: {last}"))


class OpenCodeAgent(BundledAgent):
    name = "oc"
    outcome_file = OUTCOME

    def __init__(self, bundle: Bundle, session_path: str, model: str, socket_dir: Path, budget: Budget) -> None:
        self.max_turns = budget.max_turns
        base_url = f"http://127.0.0.1:{RELAY_PORT}{session_path}/v1"
        config = oc_config(base_url, model, budget.max_turns, budget.max_context_tokens, budget.max_tokens)
        state = "/tmp/.opencode"
        env = {
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "XDG_CONFIG_HOME": f"{state}/config",
            "XDG_CACHE_HOME": f"{state}/cache",
            "XDG_DATA_HOME": f"{state}/data",
            "XDG_STATE_HOME": f"{state}/state",
        }
        super().__init__(bundle, session_path, model, socket_dir, env)
        self.command = (
            f"{shlex.quote(bundle.executable)} run --format json --pure --auto --title trial "
            f"< {AGENT_DIR_INSIDE}/instruction.md > {OUTCOME}"
        )

    def read_outcome(self, backend: Backend, sandbox: Sandbox) -> dict[str, Any] | None:
        read = backend.exec(sandbox, f"cat {OUTCOME} 2>/dev/null", 30)
        events = []
        for line in read.stdout.splitlines() if read.exit_code == 0 else []:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return {"events": events}

    def outcome(self, ended: dict[str, Any] | None, exit_code: int) -> AgentOutcome:
        return oc_outcome((ended or {}).get("events", []), exit_code, self.max_turns)
