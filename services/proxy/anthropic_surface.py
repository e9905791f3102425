"""The Anthropic Messages surface, translated to and from the upstream's OpenAI chat API.

Requests: the system prompt becomes a system message; text and image blocks become content parts;
``tool_use`` blocks become assistant ``tool_calls`` (arguments as JSON text) and ``tool_result`` blocks become
``tool`` messages placed right after them, as OpenAI requires; tools and ``tool_choice`` map one to one
(``any`` → ``required``, ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``); ``stop_sequences``
→ ``stop``. Responses: text and tool calls become ``text`` and ``tool_use`` blocks; ``finish_reason`` becomes
``stop_reason`` (``stop`` on a stop sequence → ``stop_sequence`` with the sequence, else ``end_turn``;
``length`` → ``max_tokens``; tool calls → ``tool_use``); usage becomes input and output tokens. Streams are
translated chunk by chunk into Anthropic's event sequence.
"""

from __future__ import annotations

from typing import Any

import orjson

from services.proxy.errors import TranslationError
from services.proxy.names import ModelNames
from services.proxy.openai_surface import CHAT, StreamCapture, Wants, read_response, upstream_body
from services.proxy.trajectory import Choice


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or () if isinstance(b, dict) and b.get("type") == "text")


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = source.get("url", "")
    else:
        raise TranslationError(f"image source type {source.get('type')!r} is not supported; send base64 or url")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_messages(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type")
        if kind == "tool_result":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id", ""),
                    "content": _text_of(block.get("content")),
                }
            )
        elif kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            parts.append(_image_part(block))
        elif kind == "document" and (block.get("source") or {}).get("type") == "text":
            parts.append({"type": "text", "text": block["source"].get("data", "")})
    if parts:
        single_text = len(parts) == 1 and parts[0]["type"] == "text"
        out.append({"role": "user", "content": parts[0]["text"] if single_text else parts})
    return out


def _assistant_message(content: list[dict[str, Any]]) -> dict[str, Any]:
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        if block.get("type") == "text":
            text.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            calls.append(
                {
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {"name": block.get("name", ""), "arguments": arguments},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    return message


_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(body.get("messages"), list):
        raise TranslationError("messages: a list of {role, content} is required")
    messages: list[dict[str, Any]] = []
    # Claude Code also sends context as a message of role "system" among the others: its text joins the system
    # prompt, the one place every chat template takes a system message.
    system = [_text_of(body["system"])] if body.get("system") else []
    system += [_text_of(m.get("content") or "") for m in body["messages"] if m.get("role") == "system"]
    if system:
        messages.append({"role": "system", "content": "\n\n".join(system)})
    for message in body["messages"]:
        role, content = message.get("role"), message.get("content")
        if role == "system":
            continue
        if role not in ("user", "assistant"):
            raise TranslationError(f"messages: role {role!r} is not user, assistant or system")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
        elif role == "user":
            messages.extend(_user_messages(content or []))
        else:
            messages.append(_assistant_message(content or []))
    return messages


def _tools(body: dict[str, Any], out: dict[str, Any]) -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]},
        }
        for t in body.get("tools") or ()
        if "input_schema" in t
    ]
    if tools:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if choice:
        kind = choice.get("type")
        if kind == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name", "")}}
        elif kind in _TOOL_CHOICE:
            out["tool_choice"] = _TOOL_CHOICE[kind]
        if choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False


def to_openai(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as an OpenAI chat completions request (model left as the client sent it).

    Raises:
        TranslationError: a field with no OpenAI equivalent the proxy can use.
    """
    out: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body)}
    for key in ("max_tokens", "temperature", "top_p", "top_k", "stream"):
        if key in body:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    _tools(body, out)
    if body.get("stream"):
        out["stream_options"] = {"include_usage": True}
    return out


def _stop(choice: dict[str, Any], stop_sequences: list[str]) -> tuple[str, str | None]:
    finish = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return "end_turn", None


def _input(arguments: str) -> Any:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_unparsed_arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


def message_id(openai_id: str) -> str:
    return "msg_" + openai_id.split("-", 1)[-1]


def from_openai(obj: dict[str, Any], model: str, stop_sequences: list[str]) -> dict[str, Any]:
    """An OpenAI chat completion as an Anthropic message."""
    choice = (obj.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": fn.get("name", ""),
                "input": _input(fn.get("arguments", "")),
            }
        )
    stop_reason, stop_sequence = _stop(choice, stop_sequences)
    if message.get("tool_calls") and stop_reason == "end_turn":
        stop_reason = "tool_use"
    usage = obj.get("usage") or {}
    return {
        "id": message_id(obj.get("id", "")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)},
    }


def output_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks of an OpenAI assistant message (for the trajectory of a streamed call)."""
    blocks: list[dict[str, Any]] = from_openai({"choices": [{"message": message}]}, "", [])["content"]
    return blocks


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> bytes:
    kind = _ERROR_TYPES.get(status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def upstream_error_message(body: bytes) -> str:
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return body.decode("utf-8", "replace")[:2000]
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps(data))


class StreamTranslator:
    """OpenAI chat stream chunks in, Anthropic message stream events out."""

    def __init__(self, model: str, stop_sequences: list[str]) -> None:
        self.model = model
        self.stop_sequences = stop_sequences
        self.started = False
        self.block = -1
        self.block_kind: str | None = None
        self.tool_index: int | None = None
        self.finish: dict[str, Any] = {}
        self.saw_tool = False
        self.output_tokens = 0

    def _close_block(self) -> bytes:
        if self.block_kind is None:
            return b""
        self.block_kind = None
        return event("content_block_stop", {"type": "content_block_stop", "index": self.block})

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self.block += 1
        self.block_kind = kind
        return out + event(
            "content_block_start", {"type": "content_block_start", "index": self.block, "content_block": block}
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = b""
        if not self.started:
            self.started = True
            input_tokens = len(chunk.get("prompt_token_ids") or ())
            message: dict[str, Any] = {
                "id": message_id(chunk.get("id", "")),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": 0},
            }
            out += event("message_start", {"type": "message_start", "message": message})
        if chunk.get("usage"):
            self.output_tokens = chunk["usage"].get("completion_tokens", self.output_tokens)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.block_kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out += event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self.block,
                        "delta": {"type": "text_delta", "text": delta["content"]},
                    },
                )
            for call in delta.get("tool_calls") or ():
                index = call.get("index", 0)
                fn = call.get("function") or {}
                if self.block_kind != "tool_use" or self.tool_index != index:
                    self.saw_tool = True
                    self.tool_index = index
                    out += self._open(
                        "tool_use",
                        {"type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""), "input": {}},
                    )
                if fn.get("arguments"):
                    out += event(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self.block,
                            "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]},
                        },
                    )
            if choice.get("finish_reason"):
                self.finish = choice
        return out

    def end(self) -> bytes:
        out = self._close_block()
        stop_reason, stop_sequence = _stop(self.finish, self.stop_sequences)
        if self.saw_tool and stop_reason == "end_turn":
            stop_reason = "tool_use"
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        out += event(
            "message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": self.output_tokens}}
        )
        return out + event("message_stop", {"type": "message_stop"})


ANTHROPIC = "anthropic.messages"
_EVERYTHING = Wants(logprobs=True, token_ids=True)


class AnthropicSurface:
    """``/v1/messages``: translated to OpenAI's chat API for the replica and back for the client."""

    name = ANTHROPIC
    path = "/v1/chat/completions"

    def call(self, body: dict[str, Any], models: ModelNames, learned: str | None) -> AnthropicCall:
        chat = to_openai(body)  # a request it cannot translate is refused before its model name is looked at
        served = models.resolve(body.get("model"), learned)
        up, _ = upstream_body(CHAT, chat, served)
        return AnthropicCall(up, str(body.get("model") or served), list(body.get("stop_sequences") or ()))

    def error(self, status: int, message: str, kind: str) -> bytes:
        return error_body(status, message)

    def upstream_failed(self, status: int, data: bytes) -> bytes:
        return error_body(status, upstream_error_message(data))


class AnthropicCall:
    __slots__ = ("upstream", "model", "stops")

    def __init__(self, upstream: dict[str, Any], model: str, stops: list[str]) -> None:
        self.upstream, self.model, self.stops = upstream, model, stops

    def answer(self, obj: dict[str, Any]) -> tuple[bytes, list[tuple[list[int], list[Choice]]]]:
        groups = read_response(CHAT, obj, _EVERYTHING)
        message = from_openai(obj, self.model, self.stops)
        for _, choices in groups:
            for choice in choices:
                choice.output = message["content"]
        return orjson.dumps(message), groups

    def relay(self) -> AnthropicRelay:
        return AnthropicRelay(StreamCapture(CHAT, _EVERYTHING), StreamTranslator(self.model, self.stops))


class AnthropicRelay:
    """Chunks become Anthropic's message events; ``[DONE]`` and what is not JSON are dropped."""

    __slots__ = ("capture", "translator")

    def __init__(self, capture: StreamCapture, translator: StreamTranslator) -> None:
        self.capture = capture
        self.translator = translator

    def done(self) -> bytes:
        return b""

    def unparsed(self, payload: bytes) -> bytes:
        return b""

    def upstream_error(self, obj: dict[str, Any], payload: bytes) -> bytes:
        return event("error", orjson.loads(error_body(500, upstream_error_message(payload))))

    def chunk(self, obj: dict[str, Any], payload: bytes) -> bytes:
        return self.translator.feed(obj)

    def error(self, status: int, message: str, kind: str) -> bytes:
        return event("error", orjson.loads(error_body(status, message)))

    def finish(self) -> bytes:
        opening = b"" if self.translator.started else self.translator.feed({})
        return opening + self.translator.end()

    def groups(self) -> list[tuple[list[int], list[Choice]]]:
        groups = self.capture.groups()
        for _, choices in groups:
            for choice in choices:
                choice.output = output_blocks(choice.output)
        return groups
