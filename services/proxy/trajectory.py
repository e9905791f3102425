"""Sessions and what they record: every model call a trial made, token for token, and the training sequences with
their response masks derived from those calls.

A turn is one prompt sent to the model and the choices it sampled (``n`` of them), with vLLM's own prompt token
ids, completion token ids and completion logprobs. The sequences are what a trainer consumes: each one starts with
a prompt and continues with the model's tokens (mask 1) and everything that came between them (tool output,
template tokens, the next user message: mask 0, logprob 0). A turn extends a sequence when its prompt token ids
begin with that sequence's tokens; a prompt that rewrote earlier context (truncation, a re-rendered tool call, a
retry of the same prompt) starts a new sequence, so no token is ever trained under a context it was not sampled in.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

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


@dataclass
class Turn:
    surface: str  # openai.chat, openai.completions, anthropic.messages
    request: dict[str, Any]  # the client's request as it sent it
    prompt_token_ids: list[int]
    choices: list[Choice]
    replica: str
    started_at: float
    first_token_s: float | None
    duration_s: float
    usage: dict[str, Any] | None = None
    index: int = 0

    def as_dict(self) -> dict[str, Any]:
        request = self.request
        return {
            "index": self.index,
            "surface": self.surface,
            "replica": self.replica,
            "started_at": self.started_at,
            "first_token_s": self.first_token_s,
            "duration_s": self.duration_s,
            "messages": request.get("messages"),
            "system": request.get("system"),
            "prompt": request.get("prompt"),
            "tools": request.get("tools"),
            "request": {k: v for k, v in request.items() if k not in ("messages", "system", "prompt", "tools")},
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

    def tokens(self) -> list[int]:
        return self.prompt_token_ids + self.response_token_ids

    def extended(self, turn: Turn, choice: Choice) -> Sequence:
        full = len(self.prompt_token_ids) + len(self.response_token_ids)
        between = turn.prompt_token_ids[full:]
        return Sequence(
            self.prompt_token_ids,
            self.response_token_ids + between + choice.token_ids,
            self.response_mask + [0] * len(between) + [1] * len(choice.token_ids),
            self.response_logprobs + [0.0] * len(between) + list(choice.logprobs),
            self.turns + [[turn.index, choice.index]],
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "response_token_ids": self.response_token_ids,
            "response_mask": self.response_mask,
            "response_logprobs": self.response_logprobs,
            "turns": self.turns,
        }


def derive_sequences(turns: list[Turn]) -> list[Sequence]:
    """The training sequences of a session's turns (see the module docstring)."""
    open_: list[Sequence] = []
    for turn in turns:
        prompt = turn.prompt_token_ids
        parent: Sequence | None = None
        best = -1
        for seq in open_:
            tokens = seq.tokens()
            if len(tokens) > best and len(tokens) <= len(prompt) and prompt[: len(tokens)] == tokens:
                parent, best = seq, len(tokens)
        if parent is not None:
            open_.remove(parent)
            open_.extend(parent.extended(turn, choice) for choice in turn.choices)
        else:
            root = Sequence(list(prompt))
            open_.extend(root.extended(turn, choice) for choice in turn.choices)
    return open_


class Session:
    """One trial's view of the proxy: its secret token, its sticky replica and its turns."""

    def __init__(self, metadata: dict[str, Any] | None = None) -> None:
        self.id = "s-" + secrets.token_hex(8)
        self.token = secrets.token_urlsafe(TOKEN_BYTES)
        self.metadata = metadata or {}
        self.created_at = time.time()
        self.closed_at: float | None = None
        self.turns: list[Turn] = []
        self.replica: str | None = None
        self.errors = 0
        self.idle = _Idle()

    def add_turn(self, turn: Turn) -> None:
        turn.index = len(self.turns)
        self.turns.append(turn)

    def trajectory(self) -> dict[str, Any]:
        sequences = derive_sequences(self.turns)
        return {
            "session": self.id,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "closed_at": self.closed_at,
            "errors": self.errors,
            "turns": [t.as_dict() for t in self.turns],
            "sequences": [s.as_dict() for s in sequences],
        }


class _Idle:
    """Counts requests in flight so closing a session can wait for the last one to be recorded."""

    def __init__(self) -> None:
        self.count = 0
        self._waiters: list[Any] = []

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
        import asyncio

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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(trajectory))
    os.replace(tmp, path)
    return path
