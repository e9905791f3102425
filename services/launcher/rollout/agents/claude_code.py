"""``SCAFFOLD=cc``: Claude Code inside the sandbox, from its bundle (``runctl agents build cc``).

The bundle holds Claude Code's native executable (npm's platform package, installed without its install scripts;
it needs no Node) and a Python for the relay. Claude Code runs headless on the instruction: ``claude -p
INSTRUCTION --output-format json --max-turns AGENT_MAX_ITERATIONS --model SERVED_MODEL``, with its permission prompts
off (``--dangerously-skip-permissions``; ``IS_SANDBOX=1`` lets it run so as root, which it refuses elsewhere),
against its proxy session through the relay (``ANTHROPIC_BASE_URL``: the proxy's Anthropic surface; its side
requests for titles and summaries name the proxy's side model, ``ANTHROPIC_SMALL_FAST_MODEL`` and
``ANTHROPIC_DEFAULT_HAIKU_MODEL``, so the session keeps them out of the loss; its answers are as long as
the run's response length where it has one, ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``), with its update checks,
telemetry, error reports and other non-essential traffic off. Its JSON result (``/logs/agent/cc.json``) maps to the
trial's ending:

=================================  ================  ======================================================
Claude Code's result               termination       why
=================================  ================  ======================================================
``success``, not ``is_error``      agent_completed   it answered without asking for another tool
``error_max_turns``                max_turns         ``AGENT_MAX_ITERATIONS`` turns (its ``--max-turns``)
an API error about the context     overlong          the conversation outgrew the model's context
anything else, or no result        error             its own result text (an API error, say), or its exit
=================================  ================  ======================================================

``AGENT_TIMEOUT_SEC`` is the sandbox's limit on the command: the trial ends ``timeout`` and its processes are killed.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from runctl.bundles import Bundle
from services.launcher.rollout.agents.bundled import Budget, BundledAgent
from services.launcher.rollout.agents.installed import AGENT_DIR_INSIDE, RELAY_PORT
from services.proxy.library import SIDE_MODEL
from services.sandbox.library import AgentOutcome

OUTCOME = "/logs/agent/cc.json"
#: Words of an API error that says the conversation does not fit the model's context.
CONTEXT_WORDS = ("maximum context length", "prompt is too long", "context length", "context window")


def cc_outcome(ended: dict[str, Any] | None, exit_code: int) -> AgentOutcome:
    """The trial's ending for Claude Code's JSON result (None: it printed none)."""
    if ended is None:
        return AgentOutcome("error", ("agent", f"Claude Code exited with code {exit_code} without a result"))
    subtype, text = str(ended.get("subtype") or ""), str(ended.get("result") or ended.get("error") or "")
    if subtype == "error_max_turns":
        return AgentOutcome("max_turns", ("agent_budget", "Claude Code stopped at --max-turns (AGENT_MAX_ITERATIONS)"))
    if subtype == "success" and not ended.get("is_error"):
        return AgentOutcome("agent_completed")
    if any(words in text.lower() for words in CONTEXT_WORDS):
        return AgentOutcome("overlong", ("agent_budget", f"Claude Code: {text}"[:500]))
    return AgentOutcome("error", ("agent", f"Claude Code ({subtype or 'no subtype'}): {text or 'no message'}"[:500]))


class ClaudeCodeAgent(BundledAgent):
    name = "cc"
    outcome_file = OUTCOME

    def __init__(self, bundle: Bundle, session_path: str, model: str, socket_dir: Path, budget: Budget) -> None:
        env = {
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{RELAY_PORT}{session_path}",
            "ANTHROPIC_API_KEY": "runctl-session",
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": SIDE_MODEL,  # the name its releases before 2.0 read
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": SIDE_MODEL,
            "IS_SANDBOX": "1",
            "CLAUDE_CONFIG_DIR": "/tmp/.claude",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_BUG_COMMAND": "1",
        }
        if budget.max_tokens is not None:  # the run's response length; else Claude Code's own (32,000)
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(budget.max_tokens)
        super().__init__(bundle, session_path, model, socket_dir, env)
        flags = f"--output-format json --max-turns {budget.max_turns} --model {shlex.quote(model)}"
        self.command = (
            f'{shlex.quote(bundle.executable)} -p "$(cat {AGENT_DIR_INSIDE}/instruction.md)" {flags} '
            f"--dangerously-skip-permissions > {OUTCOME}"
        )

    def outcome(self, ended: dict[str, Any] | None, exit_code: int) -> AgentOutcome:
        return cc_outcome(ended, exit_code)
