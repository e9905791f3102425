"""The OpenAI surface: what the proxy adds to each request so vLLM returns token ids and logprobs, how it reads
them back out of responses and stream chunks, and how it hides them again from a client that did not ask.

vLLM returns ``prompt_token_ids`` and per-choice ``token_ids`` when asked with ``return_token_ids``, and the
sampled token's logprob with ``logprobs`` (chat: ``true``; completions: ``0``). Without those flags the same
fields are present and null, so hiding them means setting them back to null: the client gets the response it
would have got from vLLM directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from services.proxy.names import ModelNames
from services.proxy.trajectory import Choice

CHAT, COMPLETIONS = "openai.chat", "openai.completions"


@dataclass(frozen=True)
class Wants:
    """What the client itself asked vLLM for (kept in what it receives)."""

    logprobs: bool
    token_ids: bool

    @property
    def everything(self) -> bool:
        return self.logprobs and self.token_ids


def upstream_body(surface: str, body: dict[str, Any], served_model: str) -> tuple[dict[str, Any], Wants]:
    """The request to send upstream: the client's, with the served model name and the capture flags added."""
    lp = body.get("logprobs")
    wants = Wants(logprobs=lp not in (None, False), token_ids=bool(body.get("return_token_ids")))
    up = dict(body)
    up["model"] = served_model
    up["return_token_ids"] = True
    if surface == CHAT:
        up["logprobs"] = True
    elif not wants.logprobs:
        up["logprobs"] = 0
    return up, wants


def _logprob_values(surface: str, logprobs: Any) -> list[float]:
    if not logprobs:
        return []
    if surface == CHAT:
        return [entry["logprob"] for entry in logprobs.get("content") or ()]
    return [v if v is not None else 0.0 for v in logprobs.get("token_logprobs") or ()]


def _add_choice(groups: list[tuple[list[int], list[Choice]]], prompt: list[int], choice: Choice) -> None:
    """Choices of the same prompt (``n`` > 1) form one turn; each further prompt of a request starts another."""
    if groups and groups[-1][0] == prompt:
        groups[-1][1].append(choice)
    else:
        groups.append((prompt, [choice]))


def read_response(surface: str, obj: dict[str, Any], wants: Wants) -> list[tuple[list[int], list[Choice]]]:
    """The (prompt token ids, choices) of a whole response, one pair per prompt; hides what the client did not
    ask for, in place."""
    groups: list[tuple[list[int], list[Choice]]] = []
    chat_prompt = obj.get("prompt_token_ids") or []
    for c in obj.get("choices") or ():
        output = c.get("message") if surface == CHAT else c.get("text")
        choice = Choice(
            c.get("index", 0),
            c.get("token_ids") or [],
            _logprob_values(surface, c.get("logprobs")),
            c.get("finish_reason"),
            output,
        )
        prompt = chat_prompt if surface == CHAT else (c.get("prompt_token_ids") or [])
        _add_choice(groups, prompt, choice)
        if not wants.token_ids:
            c["token_ids"] = None
            if surface == COMPLETIONS:
                c["prompt_token_ids"] = None
        if not wants.logprobs:
            c["logprobs"] = None
    if not wants.token_ids and "prompt_token_ids" in obj:
        obj["prompt_token_ids"] = None
    return groups


@dataclass
class _Partial:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    role: str = "assistant"
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)


class StreamCapture:
    """Reads token ids, logprobs and the output out of stream chunks as they pass (and hides what the client did
    not ask for, in place)."""

    def __init__(self, surface: str, wants: Wants) -> None:
        self.surface = surface
        self.wants = wants
        self.prompt_token_ids: list[int] = []
        self.parts: dict[int, _Partial] = {}
        self.usage: dict[str, Any] | None = None
        self.first_token_at: float | None = None

    def feed(self, obj: dict[str, Any]) -> None:
        if "prompt_token_ids" in obj:
            if obj["prompt_token_ids"]:
                self.prompt_token_ids = obj["prompt_token_ids"]
            if not self.wants.token_ids:
                obj["prompt_token_ids"] = None
        if obj.get("usage"):
            self.usage = obj["usage"]
        for c in obj.get("choices") or ():
            self._choice(c)

    def _choice(self, c: dict[str, Any]) -> None:
        surface, wants = self.surface, self.wants
        part = self.parts.get(c.get("index", 0))
        if part is None:
            part = self.parts[c.get("index", 0)] = _Partial()
        ids = c.get("token_ids")
        if ids:
            if self.first_token_at is None:
                self.first_token_at = time.time()
            part.token_ids.extend(ids)
        lp = c.get("logprobs")
        if lp:
            part.logprobs.extend(_logprob_values(surface, lp))
        if c.get("finish_reason"):
            part.finish_reason = c["finish_reason"]
        if surface == CHAT:
            self._delta(part, c.get("delta") or {})
        else:
            if c.get("text"):
                part.text.append(c["text"])
            if c.get("prompt_token_ids"):
                part.prompt_token_ids = c["prompt_token_ids"]
            if not wants.token_ids and "prompt_token_ids" in c:
                c["prompt_token_ids"] = None
        if not wants.token_ids and "token_ids" in c:
            c["token_ids"] = None
        if not wants.logprobs and lp is not None:
            c["logprobs"] = None

    @staticmethod
    def _delta(part: _Partial, delta: dict[str, Any]) -> None:
        if delta.get("content"):
            part.text.append(delta["content"])
        if delta.get("role"):
            part.role = delta["role"]
        for call in delta.get("tool_calls") or ():
            slot = part.tool_calls.setdefault(
                call.get("index", 0), {"id": None, "type": "function", "name": "", "arguments": []}
            )
            if call.get("id"):
                slot["id"] = call["id"]
            fn = call.get("function") or {}
            if fn.get("name"):
                slot["name"] += fn["name"]
            if fn.get("arguments"):
                slot["arguments"].append(fn["arguments"])

    def groups(self) -> list[tuple[list[int], list[Choice]]]:
        """What the stream carried, in the shape of :func:`read_response`."""
        groups: list[tuple[list[int], list[Choice]]] = []
        for index in sorted(self.parts):
            part = self.parts[index]
            text = "".join(part.text)
            if self.surface == CHAT:
                output: Any = {"role": part.role, "content": text or None}
                if part.tool_calls:
                    output["tool_calls"] = [
                        {
                            "id": t["id"],
                            "type": "function",
                            "function": {"name": t["name"], "arguments": "".join(t["arguments"])},
                        }
                        for _, t in sorted(part.tool_calls.items())
                    ]
                prompt = self.prompt_token_ids
            else:
                output = text
                prompt = part.prompt_token_ids if part.prompt_token_ids is not None else self.prompt_token_ids
            choice = Choice(index, part.token_ids, part.logprobs, part.finish_reason, output)
            _add_choice(groups, prompt, choice)
        return groups


class SSEReader:
    """Splits a byte stream of server-sent events into the payloads of their ``data:`` lines."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        if b"\n\n" not in self._buffer:
            return []
        *events, self._buffer = self._buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        payloads: list[bytes] = []
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    payloads.append(line[5:].lstrip(b" "))
        return payloads


def openai_error(status: int, message: str, kind: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "code": status}})


class OpenAISurface:
    """``/v1/chat/completions`` or ``/v1/completions``: sent on as it is, with the capture flags added."""

    __slots__ = ("name", "path")

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path

    def call(self, body: dict[str, Any], models: ModelNames, learned: str | None) -> OpenAICall:
        up, wants = upstream_body(self.name, body, models.resolve(body.get("model"), learned))
        return OpenAICall(self.name, up, wants)

    def error(self, status: int, message: str, kind: str) -> bytes:
        return openai_error(status, message, kind)

    def upstream_failed(self, status: int, data: bytes) -> bytes:
        return data


class OpenAICall:
    __slots__ = ("surface", "upstream", "wants")

    def __init__(self, surface: str, upstream: dict[str, Any], wants: Wants) -> None:
        self.surface, self.upstream, self.wants = surface, upstream, wants

    def answer(self, obj: dict[str, Any]) -> tuple[bytes, list[tuple[list[int], list[Choice]]]]:
        groups = read_response(self.surface, obj, self.wants)
        return orjson.dumps(obj), groups

    def relay(self) -> OpenAIRelay:
        return OpenAIRelay(StreamCapture(self.surface, self.wants))


class OpenAIRelay:
    """Each event sent on as it came; re-encoded only when the capture hid something the client did not ask for."""

    __slots__ = ("capture", "raw")

    def __init__(self, capture: StreamCapture) -> None:
        self.capture = capture
        self.raw = capture.wants.everything

    def done(self) -> bytes:
        return b"data: [DONE]\n\n"

    def unparsed(self, payload: bytes) -> bytes:
        return b"data: " + payload + b"\n\n"

    def upstream_error(self, obj: dict[str, Any], payload: bytes) -> bytes:
        return self.chunk(obj, payload)

    def chunk(self, obj: dict[str, Any], payload: bytes) -> bytes:
        return b"data: " + (payload if self.raw else orjson.dumps(obj)) + b"\n\n"

    def error(self, status: int, message: str, kind: str) -> bytes:
        return b"data: " + openai_error(status, message, kind) + b"\n\n"

    def finish(self) -> bytes:
        return b""

    def groups(self) -> list[tuple[list[int], list[Choice]]]:
        return self.capture.groups()
