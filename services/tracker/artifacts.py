"""A trial's artifacts, read from its run folder (the layout in :mod:`runctl.layout`): its record, its trajectory
told turn by turn, the verifier's output and the agent's logs. The tracker reads the folder where the runner wrote
it: on one machine, or on a filesystem the cluster shares."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from runctl.layout import TRAJECTORY, TRIAL_RECORD, outside_team_areas, run_folder, trial_folder, trials_folder
from services.tracker.db import RunRow

MAX_LOG_BYTES = 64 * 1024
"""A log longer than this is shown by its tail (the end of a log is where its failure is)."""
MAX_RECORD_BYTES = 64 * 1024 * 1024
"""A trial record or trajectory larger than this is not read (a sandbox wrote it, and the tracker serves many)."""


def _setting(run: RunRow, key: str) -> str | None:
    entry = (run.resolved or {}).get(key) or {}
    value = entry.get("value")
    return str(value) if value else None


def trial_path(run: RunRow, task: str, trial: int) -> Path | None:
    """Where the runner wrote this trial; None when the run's config puts it outside the team's own folders on a
    cluster that confines teams (``RUNCTL_TEAM_PATHS``): a config naming another team's folder must not make the
    tracker serve that team's files to it."""
    output_dir = _setting(run, "OUTPUT_DIR")
    results = _setting(run, "RESULTS_DIR") if run.run_type == "infer" else None
    if outside_team_areas(run.team, {"OUTPUT_DIR": output_dir, "RESULTS_DIR": results}):
        return None
    run_dir = run_folder(run.team, run.run_id, output_dir)
    return trial_folder(trials_folder(run_dir, results), task, trial)


def trial_detail(run: RunRow, task: str, trial: int) -> dict[str, Any]:
    """Everything the trial browser shows; ``found`` is false when the folder is not reachable from here."""
    folder = trial_path(run, task, trial)
    record_text = _read_text(folder / TRIAL_RECORD, folder) if folder is not None else None
    if folder is None or record_text is None:
        return {
            "found": False,
            "folder": str(folder) if folder is not None else "",
            "trial": None,
            "turns": [],
            "reward": None,
            "verifier": {},
            "logs": {},
        }
    record = json.loads(record_text)
    trajectory_text = _read_text(folder / TRAJECTORY, folder)
    trajectory = json.loads(trajectory_text) if trajectory_text is not None else {"turns": []}
    agent_turns = _read_jsonl(folder / "agent" / "terminal.jsonl", folder)
    return {
        "found": True,
        "folder": str(folder),
        "trial": record,
        "turns": turns(trajectory.get("turns", []), agent_turns),
        "reward": record.get("reward"),
        "verifier": _texts(folder / "logs" / "verifier", folder),
        "logs": _texts(folder / "agent", folder, "agent/") | _texts(folder / "logs" / "agent", folder, "logs/agent/"),
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


def _open_plain(path: Path, base: Path) -> BinaryIO | None:
    """A regular file under ``base``, opened without following links; None for anything else. Trial folders hold
    what sandboxes wrote: a link planted there (``ln -s /etc/shadow x``) must never serve a file of this machine."""
    try:
        if path.is_symlink() or base.resolve() not in path.resolve().parents:
            return None
        # Without blocking: a FIFO left there would hold the open until a writer came; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        return None
    os.set_blocking(fd, True)
    return f


def _read_text(path: Path, base: Path) -> str | None:
    f = _open_plain(path, base)
    if f is None:
        return None
    with f:
        if os.fstat(f.fileno()).st_size > MAX_RECORD_BYTES:
            return None
        return f.read(MAX_RECORD_BYTES).decode(errors="replace")


def _read_jsonl(path: Path, base: Path) -> list[dict[str, Any]]:
    text = _read_text(path, base)
    if text is None:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a killed agent
    return rows


def _texts(folder: Path, base: Path, prefix: str = "") -> dict[str, str]:
    """Every plain file under ``folder`` (links are neither followed nor shown), each by its last MAX_LOG_BYTES."""
    if folder.is_symlink() or not folder.is_dir():
        return {}
    out = {}
    for top, dirs, files in os.walk(folder):  # os.walk does not descend into linked folders
        for name in sorted(files):
            path = Path(top) / name
            f = _open_plain(path, base)
            if f is None:
                continue
            with f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - MAX_LOG_BYTES))
                out[prefix + str(path.relative_to(folder))] = f.read().decode(errors="replace")
        dirs.sort()
    return dict(sorted(out.items()))
