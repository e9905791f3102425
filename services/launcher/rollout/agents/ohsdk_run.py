"""The OpenHands SDK's agent on one trial, inside the sandbox, on its bundle's Python 3.12 (``runctl.bundles``).

``python ohsdk_run.py OUTCOME_JSON SETTINGS_JSON``: runs the SDK's ``Agent`` with its default tools for a shell
session (the terminal, as a plain subprocess: no tmux in a sandbox; the file editor; the task tracker) and no browser,
in a ``Conversation`` on the sandbox's working folder, on the task's instruction. Its LLM is litellm's
OpenAI-compatible provider pointed at the trial's proxy session (``openai/<served model>``, ``base_url`` = the
session's ``/v1``), with the served context as its input limit where the run gives one, and no retries (the proxy
answers for the replicas). SETTINGS_JSON (one argument) gives the session's ``base_url``, the ``model``'s name,
``temperature``, ``max_tokens`` and ``max_context_tokens``, the ``instruction`` file, and ``max_turns``: the
conversation's ``max_iteration_per_run``. Writes what ended it to OUTCOME_JSON: ``{"status": ..., "code": ...,
"message": ..., "calls": ...}`` — the conversation's execution status (``finished``, ``error``, ``stuck``), the code
of its last error event (``MaxIterationsReached``, an LLM error's class), its detail, and how many LLM calls it
made. Nothing here is runctl's: it must import with the bundle alone.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    outcome, given = Path(argv[1]), json.loads(argv[2])
    # The loader read the bundle's library folder as this process started; the agent's commands keep the image's own.
    os.environ.pop("LD_LIBRARY_PATH", None)
    from openhands.sdk import LLM, Agent, Conversation, Tool  # type: ignore[import-not-found]  # the bundle's
    from openhands.sdk.event.conversation_error import ConversationErrorEvent  # type: ignore[import-not-found]
    from openhands.tools.file_editor import FileEditorTool  # type: ignore[import-not-found]
    from openhands.tools.task_tracker import TaskTrackerTool  # type: ignore[import-not-found]
    from openhands.tools.terminal import TerminalTool  # type: ignore[import-not-found]

    limits: dict[str, object] = {}
    if given.get("max_tokens"):
        limits["max_output_tokens"] = int(given["max_tokens"])
    if given.get("max_context_tokens"):
        limits["max_input_tokens"] = int(given["max_context_tokens"])
    errors: list[object] = []
    calls = 0

    def seen(event: object) -> None:
        if isinstance(event, ConversationErrorEvent):
            errors.append(event)

    ended: dict[str, object]
    try:
        llm = LLM(
            model=f"openai/{given['model']}",
            base_url=given["base_url"],
            api_key="runctl-session",
            temperature=float(given["temperature"]),
            num_retries=0,
            usage_id="agent",
            **limits,
        )
        tools = [
            Tool(name=TerminalTool.name, params={"terminal_type": "subprocess"}),
            Tool(name=FileEditorTool.name),
            Tool(name=TaskTrackerTool.name),
        ]
        conversation = Conversation(
            agent=Agent(llm=llm, tools=tools),
            workspace=os.getcwd(),
            max_iteration_per_run=int(given["max_turns"]),
            callbacks=[seen],
            visualizer=None,
        )
        try:
            conversation.send_message(Path(given["instruction"]).read_text())
            conversation.run()
        finally:
            calls = len(llm.metrics.token_usages) if llm.metrics is not None else 0
        status = str(getattr(conversation.state.execution_status, "value", conversation.state.execution_status))
        last = errors[-1] if errors else None
        ended = {"status": status, "code": str(getattr(last, "code", "")), "message": str(getattr(last, "detail", ""))}
    except Exception as e:  # what stopped the agent: an API error the SDK raised, a crash
        ended = {"status": "error", "code": type(e).__name__, "message": str(e)}
    ended["message"] = str(ended["message"])[:2000]
    ended["calls"] = calls
    outcome.write_text(json.dumps(ended))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
