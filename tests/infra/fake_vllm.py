"""A fast, deterministic OpenAI-compatible upstream shaped like vLLM 0.32, for the proxy's unit tests and benchmark.

It is not a model: a prompt's token ids are the UTF-8 bytes of its ChatML rendering, ``<|im_end|>`` being one
token (so a multi-turn conversation's prompts extend each other exactly as a real chat template's do), the completion
is a fixed function of the prompt, and each sampled token's logprob is a fixed function of its id. Like vLLM, it returns
``prompt_token_ids`` / ``token_ids`` only with ``return_token_ids`` and logprobs only when asked, leaving the
fields null otherwise. With tools offered and a user message last, it calls the first tool (or the one named by
``tool_choice``), with ``{}`` as arguments.

``python -m tests.infra.fake_vllm --port P [--model NAME] [--delay-ms D]`` runs it as its own process (the
benchmark's upstream, as a real replica is a separate process).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson

from services.proxy.http11 import HttpServer, Request, Responder

EOS = 2
MODEL = "fake-model"


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """ChatML, with the tool calls of assistant messages rendered the way :func:`reply` writes them."""
    out = []
    if tools:
        out.append("<|im_start|>system\ntools: " + ",".join(t["function"]["name"] for t in tools) + "<|im_end|>\n")
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = content or ""
        for call in m.get("tool_calls") or ():
            text += tool_call_text(call["function"]["name"], call["function"]["arguments"])
        out.append(f"<|im_start|>{m.get('role')}\n{text}<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


def tool_call_text(name: str, arguments: str) -> str:
    return f"<tool_call>{name} {arguments}</tool_call>"


def token_ids(text: str) -> list[int]:
    """UTF-8 bytes, with ``<|im_end|>`` as the single end-of-turn token (as a real ChatML tokenizer has it)."""
    ids: list[int] = []
    for i, piece in enumerate(text.split("<|im_end|>")):
        if i:
            ids.append(EOS)
        ids.extend(piece.encode())
    return ids


def logprob(token: int) -> float:
    return -((token * 7919) % 1000) / 997.0


def reply(
    prompt_ids: list[int],
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    last_role: str | None,
    index: int,
    max_tokens: int | None,
    arguments: str = "{}",
) -> tuple[str, list[dict[str, Any]] | None, str]:
    """(text, tool calls, finish reason) for a prompt; a tool call carries ``arguments``."""
    if tools and tool_choice != "none" and last_role == "user":
        name = tools[0]["function"]["name"]
        if isinstance(tool_choice, dict):
            name = tool_choice["function"]["name"]
        call = {
            "id": f"chatcmpl-tool-{len(prompt_ids)}-{index}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        return "", [call], "tool_calls"
    text = f"reply {len(prompt_ids) % 97} {index}."
    if max_tokens is not None and len(text) > max_tokens:
        return text[:max_tokens], None, "length"
    return text, None, "stop"


class FakeVLLM:
    def __init__(
        self,
        model: str = MODEL,
        delay_s: float = 0.0,
        sleeping: bool = False,
        health_delay_s: float = 0.0,
        tool_arguments: str = "{}",
    ) -> None:
        """``tool_arguments``: what its tool calls pass (a bash command, for a test whose agent must act)."""
        self.model = model
        self.tool_arguments = tool_arguments
        self.delay_s = delay_s
        self.health_delay_s = health_delay_s  # a starved host: the probe waits, the work goes on
        self.sleeping = sleeping
        self.requests: list[dict[str, Any]] = []
        self.abandoned = 0  # requests whose client left before the (delayed) answer
        self.server = HttpServer(self.handle)
        self.record = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def start(self, port: int = 0) -> FakeVLLM:
        self.server.port = port
        await self.server.start()
        return self

    async def close(self) -> None:
        await self.server.close(grace_s=1.0)

    async def handle(self, req: Request, resp: Responder) -> None:
        path = req.path
        if path == "/health":
            await asyncio.sleep(self.health_delay_s)
            resp.send(200, b"")
        elif path == "/is_sleeping":
            resp.send(200, orjson.dumps({"is_sleeping": self.sleeping}))
        elif path == "/v1/models":
            resp.send(
                200,
                orjson.dumps({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "vllm"}]}),
            )
        elif path in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
            body = orjson.loads(req.body)
            if self.record:
                self.requests.append(body)
            if body.get("model") not in (None, self.model):
                msg = f"The model `{body.get('model')}` does not exist."
                resp.send(
                    404,
                    orjson.dumps({"error": {"message": msg, "type": "NotFoundError", "param": "model", "code": 404}}),
                )
                return
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
                if resp.client_gone:
                    self.abandoned += 1
                    return
            if path == "/tokenize":
                resp.send(
                    200,
                    orjson.dumps(
                        {"count": len(token_ids(render(body["messages"], body.get("tools")))), "max_model_len": 4096}
                    ),
                )
            elif path == "/v1/chat/completions":
                await self._chat(body, resp)
            else:
                await self._completions(body, resp)
        else:
            resp.send(404, b'{"detail": "Not Found"}')

    def _choices(self, prompt_ids: list[int], body: dict[str, Any], last_role: str | None) -> list[dict[str, Any]]:
        out = []
        for i in range(body.get("n") or 1):
            text, calls, finish = reply(
                prompt_ids,
                body.get("tools"),
                body.get("tool_choice"),
                last_role,
                i,
                body.get("max_tokens"),
                self.tool_arguments,
            )
            called = tool_call_text(calls[0]["function"]["name"], self.tool_arguments) if calls else ""
            sampled = token_ids(text + called) + ([EOS] if finish != "length" else [])
            out.append({"text": text, "calls": calls, "finish": finish, "ids": sampled})
        return out

    async def _chat(self, body: dict[str, Any], resp: Responder) -> None:
        messages = body["messages"]
        prompt_ids = token_ids(render(messages, body.get("tools")))
        choices = self._choices(prompt_ids, body, messages[-1].get("role") if messages else None)
        want_ids, want_lp = bool(body.get("return_token_ids")), bool(body.get("logprobs"))
        created = int(time.time())
        cid = f"chatcmpl-{len(self.requests):016x}"
        completion_tokens = sum(len(c["ids"]) for c in choices)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "total_tokens": len(prompt_ids) + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }

        def lp(ids: list[int]) -> dict[str, Any] | None:
            return (
                {
                    "content": [
                        {"token": f"token_id:{t}", "logprob": logprob(t), "bytes": None, "top_logprobs": []}
                        for t in ids
                    ]
                }
                if want_lp
                else None
            )

        if not body.get("stream"):
            out_choices = [
                {
                    "index": i,
                    "message": {
                        "role": "assistant",
                        "content": c["text"] or None,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": c["calls"] or [],
                        "reasoning": None,
                    },
                    "logprobs": lp(c["ids"]),
                    "finish_reason": c["finish"],
                    "stop_reason": None,
                    "token_ids": c["ids"] if want_ids else None,
                }
                for i, c in enumerate(choices)
            ]
            resp.send(
                200,
                orjson.dumps(
                    {
                        "id": cid,
                        "object": "chat.completion",
                        "created": created,
                        "model": self.model,
                        "choices": out_choices,
                        "usage": usage,
                        "prompt_logprobs": None,
                        "prompt_token_ids": prompt_ids if want_ids else None,
                        "kv_transfer_params": None,
                    }
                ),
            )
            return
        resp.start_stream(200)
        head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.model}
        for i, c in enumerate(choices):
            first = {
                **head,
                "choices": [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
            }
            if i == 0:
                first["prompt_token_ids"] = prompt_ids if want_ids else None
            await resp.write(b"data: " + orjson.dumps(first) + b"\n\n")
            ids = c["ids"]
            pieces: list[tuple[dict[str, Any], list[int]]] = []
            if c["calls"]:
                call = c["calls"][0]
                pieces.append(
                    (
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": call["id"],
                                    "type": "function",
                                    "function": {"name": call["function"]["name"], "arguments": ""},
                                }
                            ]
                        },
                        ids[:-3],
                    )
                )
                pieces.append(({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, ids[-3:]))
            else:
                words = c["text"].split(" ")
                at = 0
                for w, word in enumerate(words):
                    piece = word + (" " if w < len(words) - 1 else "")
                    n = len(piece.encode()) + (1 if w == len(words) - 1 and c["finish"] != "length" else 0)
                    pieces.append(({"content": piece}, ids[at : at + n]))
                    at += n
            for p, (delta, piece_ids) in enumerate(pieces):
                last = p == len(pieces) - 1
                chunk = {
                    **head,
                    "choices": [
                        {
                            "index": i,
                            "delta": delta,
                            "logprobs": lp(piece_ids),
                            "finish_reason": c["finish"] if last else None,
                            "token_ids": piece_ids if want_ids else None,
                        }
                    ],
                }
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        resp.end()

    async def _completions(self, body: dict[str, Any], resp: Responder) -> None:
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        want_ids, want_lp = bool(body.get("return_token_ids")), body.get("logprobs") is not None
        out_choices: list[dict[str, Any]] = []
        total_prompt = total_completion = 0
        for prompt in prompts:
            prompt_ids = (
                prompt
                if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
                else token_ids(str(prompt))
            )
            total_prompt += len(prompt_ids)
            for c in self._choices(prompt_ids, body, None):
                total_completion += len(c["ids"])
                logprobs = (
                    {
                        "text_offset": list(range(len(c["ids"]))),
                        "token_logprobs": [logprob(t) for t in c["ids"]],
                        "tokens": [f"token_id:{t}" for t in c["ids"]],
                        "top_logprobs": None,
                    }
                    if want_lp
                    else None
                )
                out_choices.append(
                    {
                        "index": len(out_choices),
                        "text": c["text"],
                        "logprobs": logprobs,
                        "finish_reason": c["finish"],
                        "stop_reason": None,
                        "token_ids": c["ids"] if want_ids else None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": prompt_ids if want_ids else None,
                    }
                )
        usage = {
            "prompt_tokens": total_prompt,
            "total_tokens": total_prompt + total_completion,
            "completion_tokens": total_completion,
        }
        resp.send(
            200,
            orjson.dumps(
                {
                    "id": f"cmpl-{len(self.requests):016x}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": self.model,
                    "choices": out_choices,
                    "usage": usage,
                }
            ),
        )


async def _main(port: int, model: str, delay_ms: float) -> None:
    fake = FakeVLLM(model, delay_ms / 1000)
    fake.record = False
    await fake.start(port)
    print(f"fake vLLM on {fake.url}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_main(args.port, args.model, args.delay_ms))
