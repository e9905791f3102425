"""Sessions and what they record: every model call a trial made, token for token, and the training sequences with
their response masks derived from those calls.

A turn is one prompt sent to the model and the choices it sampled (``n`` of them), with vLLM's own prompt token
ids, completion token ids and completion logprobs. The sequences are what a trainer consumes: each one starts with
a prompt and continues with the model's tokens (mask 1) and everything that came between them (tool output,
template tokens, the next user message: mask 0, logprob 0). A turn extends a sequence when its prompt token ids
begin with that sequence's tokens; a prompt that rewrote earlier context (truncation, a re-rendered tool call, a
retry of the same prompt) starts a new sequence, so no token is ever trained under a context it was not sampled in.

A side turn (a call for :data:`services.proxy.names.SIDE_MODEL`: a title, a summary, a classification the scaffold
asks for beside the agent's work) is recorded whole with ``side: true`` and is in no sequence: it is not the policy
acting on the task, so it stays out of the loss, and the policy's own sequences go on past it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from runctl.home import write_atomic

TOKEN_BYTES = 24  # 192 random bits in every session URL


@dataclass
class Choice:
    index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    output: Any = None  # the assistant message, the text, or the Anthropic content blocks the client received

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "completion_token_ids": self.token_ids,
            "completion_logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
            "output": self.output,
        }


PROMPT_FIELDS = ("messages", "system", "prompt", "tools")


@dataclass
class Turn:
    """One prompt and its choices.

    Stored compactly, because an agent's prompts repeat each other: a prompt that extends an earlier turn's
    prompt and completion keeps only the tokens it adds (``prompt_extends`` names that turn and choice), and
    messages that extend the previous turn's keep only the new ones (``messages_extends``). :func:`prompt_ids`
    and :func:`messages` rebuild the whole of either from a trajectory.
    """

    surface: str  # openai.chat, openai.completions, anthropic.messages
    request: dict[str, Any]  # the client's request as it sent it
    prompt_token_ids: list[int]  # the whole prompt until recorded; then only what it adds
    choices: list[Choice]
    replica: str
    started_at: float
    first_token_s: float | None
    duration_s: float
    usage: dict[str, Any] | None = None
    index: int = 0
    prompt_extends: tuple[int, int] | None = None
    messages_extends: int | None = None
    side: bool = False  # not the policy's turn: recorded, in no sequence

    def as_dict(self) -> dict[str, Any]:
        request = self.request
        return {
            "index": self.index,
            "surface": self.surface,
            "side": self.side,
            "replica": self.replica,
            "started_at": self.started_at,
            "first_token_s": self.first_token_s,
            "duration_s": self.duration_s,
            "messages_extends": self.messages_extends,
            "messages": request.get("messages"),
            "system": request.get("system"),
            "prompt": request.get("prompt"),
            "tools": request.get("tools"),
            "request": {k: v for k, v in request.items() if k not in PROMPT_FIELDS},
            "prompt_extends": list(self.prompt_extends) if self.prompt_extends else None,
            "prompt_token_ids": self.prompt_token_ids,
            "choices": [c.as_dict() for c in self.choices],
            "usage": self.usage,
        }


@dataclass
class Sequence:
    """One training sequence: the prompt of its first turn, then a response with its mask and logprobs."""

    prompt_token_ids: list[int]
    response_token_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    turns: list[list[int]] = field(default_factory=list)  # [turn index, choice index] per model segment

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.response_token_ids)

    def is_prefix_of(self, prompt: list[int]) -> bool:
        head = len(self.prompt_token_ids)
        return (
            len(self) <= len(prompt)
            and prompt[:head] == self.prompt_token_ids
            and prompt[head : len(self)] == self.response_token_ids
        )

    def extend(self, added: list[int], turn: int, choice: Choice) -> None:
        """Append the tokens between (mask 0) and the model's (mask 1), in place."""
        self.response_token_ids += added
        self.response_token_ids += choice.token_ids
        self.response_mask += [0] * len(added)
        self.response_mask += [1] * len(choice.token_ids)
        self.response_logprobs += [0.0] * len(added)
        self.response_logprobs += choice.logprobs
        self.turns.append([turn, choice.index])

    def copy(self) -> Sequence:
        return Sequence(
            self.prompt_token_ids,
            list(self.response_token_ids),
            list(self.response_mask),
            list(self.response_logprobs),
            [list(t) for t in self.turns],
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "response_token_ids": self.response_token_ids,
            "response_mask": self.response_mask,
            "response_logprobs": self.response_logprobs,
            "turns": self.turns,
        }


RECENT_SEQUENCES = 64


class Recorder:
    """Turns in, compact turns and training sequences out, as the calls happen (see the module docstring).

    A turn may extend any of the session's ``RECENT_SEQUENCES`` most recently extended sequences (an agent and its
    sub-agents interleave a few at a time), so recording costs the same at the ten-thousandth turn as at the first.
    """

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.sequences: list[Sequence] = []
        self._recent: list[Sequence] = []
        # The previous policy turn's messages, system and tools, and its index.
        self._last: tuple[Any, tuple[Any, Any], int] | None = None

    def add(self, turn: Turn) -> None:
        turn.index = len(self.turns)
        if turn.side:  # whole, and neither a sequence nor the frame the next turn's messages extend
            self.turns.append(turn)
            return
        prompt = turn.prompt_token_ids
        parent: Sequence | None = None
        for seq in self._recent:
            if (parent is None or len(seq) > len(parent)) and seq.is_prefix_of(prompt):
                parent = seq
        added: list[int] = []
        if parent is None:
            base = Sequence(prompt)
            self.sequences.append(base)
        else:
            self._recent.remove(parent)
            base = parent
            added = prompt[len(parent) :]
            last_turn, last_choice = parent.turns[-1]
            turn.prompt_extends = (last_turn, last_choice)
            turn.prompt_token_ids = added
        for i, choice in enumerate(turn.choices):
            seq = base if i == len(turn.choices) - 1 else base.copy()  # copies before the base is extended
            if seq is not base:
                self.sequences.append(seq)
            seq.extend(added, turn.index, choice)
            self._recent.append(seq)
        del self._recent[:-RECENT_SEQUENCES]
        self._compact_messages(turn)
        self.turns.append(turn)

    def _compact_messages(self, turn: Turn) -> None:
        """Keep only the messages a turn adds to the previous turn's (same system prompt and tools: those are then
        inherited too)."""
        request = turn.request
        messages = request.get("messages")
        frame = (request.get("system"), request.get("tools"))
        previous, self._last = self._last, (messages, frame, turn.index)
        if previous is None or not isinstance(messages, list) or not isinstance(previous[0], list):
            return
        before, before_frame, before_index = previous
        if frame == before_frame and len(before) <= len(messages) and messages[: len(before)] == before:
            kept = {k: v for k, v in request.items() if k not in ("system", "tools")}
            kept["messages"] = messages[len(before) :]
            turn.request = kept
            turn.messages_extends = before_index


def derive_sequences(turns: list[Turn]) -> list[Sequence]:
    """The training sequences of whole (not yet recorded) turns; :class:`Recorder` does the same as they come."""
    recorder = Recorder()
    for turn in turns:
        recorder.add(turn)
    return recorder.sequences


def prompt_ids(trajectory: dict[str, Any], index: int) -> list[int]:
    """The whole prompt token ids of turn ``index`` of a trajectory (as written or served)."""
    turns = trajectory["turns"]
    parts: list[list[int]] = []
    while True:
        turn = turns[index]
        parts.append(turn["prompt_token_ids"])
        if turn["prompt_extends"] is None:
            break
        index, choice = turn["prompt_extends"]
        parts.append(turns[index]["choices"][choice]["completion_token_ids"])
    return [t for part in reversed(parts) for t in part]


@dataclass(frozen=True)
class CapturedUsage:
    """What the model did for one session, read from its capture."""

    turns: int
    """The policy's calls (side calls are not turns of the agent)."""
    prompt_tokens: int
    """Tokens every call (side ones too: the replicas read them) sent as its prompt."""
    completion_tokens: int
    """Tokens every call's choices generated, side ones too."""
    model_s: float
    """Seconds the calls took, from request to last token."""


def captured_usage(trajectory: dict[str, Any]) -> CapturedUsage:
    """The turns, tokens and model time of a trajectory: what an agent that talks to the proxy from inside its sandbox
    cannot report itself. A prompt's length is vLLM's count where it gave one, else the whole prompt's ids."""
    turns = trajectory.get("turns") or []
    prompt = completion = 0
    seconds = 0.0
    for index, turn in enumerate(turns):
        completion += sum(len(c["completion_token_ids"]) for c in turn["choices"])
        counted = (turn.get("usage") or {}).get("prompt_tokens")
        prompt += int(counted) if counted is not None else len(prompt_ids(trajectory, index))
        seconds += float(turn.get("duration_s") or 0.0)
    policy = sum(1 for t in turns if not t.get("side"))
    return CapturedUsage(policy, prompt, completion, seconds)


def prompt_request(trajectory: dict[str, Any], index: int) -> dict[str, Any]:
    """The whole ``messages``, ``system`` and ``tools`` the client sent in turn ``index`` of a trajectory."""
    turns = trajectory["turns"]
    chain: list[list[Any]] = []
    while True:
        turn = turns[index]
        chain.append(turn["messages"] or [])
        if turn["messages_extends"] is None:
            break
        index = turn["messages_extends"]
    root = turns[index]
    return {
        "messages": [m for part in reversed(chain) for m in part],
        "system": root["system"],
        "tools": root["tools"],
    }


class Session:
    """One trial's view of the proxy: its secret token, its sticky replica and its turns."""

    def __init__(self, metadata: dict[str, Any] | None = None, max_turns: int | None = None) -> None:
        self.id = "s-" + secrets.token_hex(8)
        self.token = secrets.token_urlsafe(TOKEN_BYTES)
        self.metadata = metadata or {}
        self.created_at = time.time()
        self.closed_at: float | None = None
        self.recorder = Recorder()
        self.replica: str | None = None
        self.errors = 0
        self.idle = _Idle()
        self.max_turns = max_turns
        """The policy turns the session answers (None: no limit); side calls are not counted."""
        self.policy_turns = 0
        """Policy calls admitted: answered, or on their way."""
        self.refused = 0
        """Policy calls refused because :attr:`max_turns` were spent."""

    def admit_turn(self) -> bool:
        """Count one more policy call, unless the session's turns are spent (then count a refusal): whether the call
        may go on. Calls that fail give their turn back (:meth:`give_back_turn`)."""
        if self.max_turns is not None and self.policy_turns >= self.max_turns:
            self.refused += 1
            return False
        self.policy_turns += 1
        return True

    def give_back_turn(self) -> None:
        self.policy_turns -= 1

    @property
    def turns(self) -> list[Turn]:
        return self.recorder.turns

    def add_turn(self, turn: Turn) -> None:
        self.recorder.add(turn)

    def trajectory(self) -> dict[str, Any]:
        return {
            "session": self.id,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "closed_at": self.closed_at,
            "errors": self.errors,
            "max_turns": self.max_turns,
            "refused_over_budget": self.refused,
            "turns": [t.as_dict() for t in self.turns],
            "sequences": [s.as_dict() for s in self.recorder.sequences],
        }


class _Idle:
    """Counts requests in flight so closing a session can wait for the last one to be recorded."""

    def __init__(self) -> None:
        self.count = 0
        self._waiters: list[asyncio.Future[None]] = []

    def enter(self) -> None:
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._waiters.clear()

    async def wait(self, timeout_s: float) -> bool:
        if self.count == 0:
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return False
        return True


def write_trajectory(folder: Path, trajectory: dict[str, Any]) -> Path:
    """Write ``<folder>/<session id>.json`` atomically (a reader never sees half a file)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{trajectory['session']}.json"
    write_atomic(path, orjson.dumps(trajectory))
    return path
