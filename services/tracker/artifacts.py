"""A trial's artifacts, read from its run folder (the layout in :mod:`runctl.layout`): its record, its trajectory
told turn by turn, the verifier's output and the agent's logs. The tracker reads the folder where the runner wrote
it: on one machine, or on a filesystem the cluster shares."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runctl.layout import TRAJECTORY, TRIAL_RECORD, run_folder, trial_folder, trials_folder
from services.tracker.db import RunRow

MAX_LOG_BYTES = 64 * 1024
"""A log longer than this is shown by its tail (the end of a log is where its failure is)."""


def _setting(run: RunRow, key: str) -> str | None:
    entry = (run.resolved or {}).get(key) or {}
    value = entry.get("value")
    return str(value) if value else None


def trial_path(run: RunRow, task: str, trial: int) -> Path:
    """Where the runner wrote this trial."""
    run_dir = run_folder(run.team, run.run_id, _setting(run, "OUTPUT_DIR"))
    results = _setting(run, "RESULTS_DIR") if run.run_type == "infer" else None
    return trial_folder(trials_folder(run_dir, results), task, trial)


def trial_detail(run: RunRow, task: str, trial: int) -> dict[str, Any]:
    """Everything the trial browser shows; ``found`` is false when the folder is not reachable from here."""
    folder = trial_path(run, task, trial)
    if not (folder / TRIAL_RECORD).is_file():
        return {
            "found": False,
            "folder": str(folder),
            "trial": None,
            "turns": [],
            "reward": None,
            "verifier": {},
            "logs": {},
        }
    record = json.loads((folder / TRIAL_RECORD).read_text())
    trajectory_file = folder / TRAJECTORY
    trajectory = json.loads(trajectory_file.read_text()) if trajectory_file.is_file() else {"turns": []}
    agent_turns = _read_jsonl(folder / "agent" / "terminal.jsonl")
    return {
        "found": True,
        "folder": str(folder),
        "trial": record,
        "turns": turns(trajectory.get("turns", []), agent_turns),
        "reward": record.get("reward"),
        "verifier": _texts(folder / "logs" / "verifier"),
        "logs": _texts(folder / "agent", prefix="agent/") | _texts(folder / "logs" / "agent", prefix="logs/agent/"),
    }


def turns(recorded: list[dict[str, Any]], agent_turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trajectory as the trial browser tells it: per model call, the messages new to it, the model's answer,
    and what running its tool calls gave (from the terminal agent's log; for other agents, from the tool messages
    of the next call)."""
    by_turn = {int(t.get("turn", -1)): t for t in agent_turns}
    out: list[dict[str, Any]] = []
    for position, turn in enumerate(recorded):
        messages = [_message(m) for m in turn.get("messages") or []]
        if turn.get("messages_extends") is not None and messages and messages[0]["role"] == "assistant":
            messages = messages[1:]  # the previous answer, already shown as that turn's response
        choices = turn.get("choices") or [{}]
        response = _response(choices[0].get("output") or {})
        agent = by_turn.get(position)
        if agent is not None:
            results = [
                {"command": _command(call.get("arguments")), "output": str(call.get("output", ""))}
                for call in agent.get("tool_calls", [])
            ]
        else:
            following = recorded[position + 1].get("messages") or [] if position + 1 < len(recorded) else []
            results = [{"command": "", "output": _text(m.get("content"))} for m in following if m.get("role") == "tool"]
        usage = turn.get("usage") or {}
        out.append(
            {
                "index": turn.get("index", position),
                "messages": messages,
                "response": response,
                "tool_results": results,
                "tokens": {"prompt": usage.get("prompt_tokens"), "completion": usage.get("completion_tokens")},
                "duration_s": turn.get("duration_s"),
            }
        )
    return out


def _message(message: dict[str, Any]) -> dict[str, Any]:
    return {"role": str(message.get("role", "?")), "content": _text(message.get("content"))}


def _response(output: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message or an Anthropic content list, as text plus tool calls."""
    content = output.get("content")
    calls: list[dict[str, str]] = []
    for call in output.get("tool_calls") or []:
        function = call.get("function") or {}
        calls.append({"name": str(function.get("name", "")), "arguments": str(function.get("arguments", ""))})
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append({"name": str(block.get("name", "")), "arguments": json.dumps(block.get("input", {}))})
    return {"content": _text(content) or None, "tool_calls": calls}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [b.get("text", "") if isinstance(b, dict) else str(b) for b in content]
        return "\n".join(p for p in parts if p)
    return json.dumps(content)


def _command(arguments: Any) -> str:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return str(arguments)
    return str(parsed.get("command", arguments)) if isinstance(parsed, dict) else str(arguments)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a killed agent
    return rows


def _texts(folder: Path, prefix: str = "") -> dict[str, str]:
    if not folder.is_dir():
        return {}
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with path.open("rb") as f:
            size = path.stat().st_size
            f.seek(max(0, size - MAX_LOG_BYTES))
            text = f.read().decode(errors="replace")
        out[prefix + str(path.relative_to(folder))] = text
    return out
