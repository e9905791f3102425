"""Class 6: sequence lengths and memory against the model and the GPU."""

from __future__ import annotations

from runctl.config.models import TrainConfig
from services.validator.checks.common import rollout_gpus, serving_length, train_world
from services.validator.facts import kv_bytes_per_token
from services.validator.registry import Context, Verdict, check, fatal, ok, skip, warn

FIT = 6
GIB = 1024**3
#: bf16 weights and gradients, fp32 master weights and two Adam moments, sharded by FSDP over the training GPUs.
TRAIN_BYTES_PER_PARAM = 16
SERVE_BYTES_PER_PARAM = 2
WARN_SHARE = 0.9


@check("fit.lengths", FIT, "prompts or responses cut off, or vLLM refusing requests mid-run", ["train"])
def lengths(ctx: Context) -> Verdict:
    c = ctx.config
    assert isinstance(c, TrainConfig)
    total = c.max_prompt + c.max_resp
    if c.max_model_len is not None and total > c.max_model_len:
        return fatal(
            f"MAX_PROMPT + MAX_RESP = {total} exceeds MAX_MODEL_LEN={c.max_model_len}: long trials fail.",
            "raise MAX_MODEL_LEN or lower MAX_PROMPT / MAX_RESP.",
        )
    return ok(f"MAX_PROMPT + MAX_RESP = {total} tokens fit the serving length {serving_length(c)}")


@check("fit.position_limit", FIT, "vLLM refusing to start, or garbage past the trained context", needs_facts=True)
def position_limit(ctx: Context) -> Verdict:
    assert ctx.facts is not None
    length, limit = serving_length(ctx.config), ctx.facts.max_position_embeddings
    if length is None:
        return skip("no MAX_MODEL_LEN: vLLM uses the model's own limit")
    if limit is None:
        return skip("config.json gives no position limit")
    if length > limit:
        if ctx.facts.rope_scaling:
            return warn(
                f"serving length {length} exceeds max_position_embeddings={limit}; rope scaling may cover it.",
                "check the model's rope scaling supports this length.",
            )
        return fatal(
            f"serving length {length} exceeds the model's max_position_embeddings={limit}: vLLM will refuse to start.",
            f"keep MAX_MODEL_LEN (or MAX_PROMPT + MAX_RESP) ≤ {limit}.",
        )
    return ok(f"serving length {length} ≤ the model's limit {limit}")


def _share(need_gib: float, have_gib: float, what: str, fix: str) -> Verdict:
    if need_gib > have_gib:
        return fatal(
            f"{what} needs about {need_gib:.1f} GiB per GPU but has {have_gib:.1f}: it will run out of memory.", fix
        )
    if need_gib > WARN_SHARE * have_gib:
        return warn(f"{what} needs about {need_gib:.1f} GiB of {have_gib:.1f} GiB per GPU: little room left.", fix)
    return ok(f"{what}: about {need_gib:.1f} GiB of {have_gib:.1f} GiB per GPU")


@check(
    "fit.memory_serving",
    FIT,
    "vLLM refusing to start (no room for one full-length sequence's KV cache) after the cluster came up",
    needs_facts=True,
)
def memory_serving(ctx: Context) -> Verdict:
    c, facts = ctx.config, ctx.facts
    assert facts is not None
    if c.ngpus_per_node == 0 or rollout_gpus(c) == 0:
        return skip("no GPUs: a CPU run")
    if facts.num_params is None:
        return skip("config.json does not give the model's shape")
    utilisation = getattr(c, "gpu_mem_util", None) or (0.85 if getattr(c, "training_mode", "") == "async" else 0.6)
    weights = facts.num_params * SERVE_BYTES_PER_PARAM / c.gen_tp / GIB
    per_token, length = kv_bytes_per_token(facts, c.gen_tp), serving_length(c)
    kv = per_token * length / GIB if per_token and length else 0.0
    budget = c.gpu_memory_gb * utilisation
    fix = "raise GEN_TP, or GPU_MEM_UTIL, or use a bigger GPU."
    if kv and weights <= budget < weights + kv:
        return fatal(
            f"vLLM weights at TP {c.gen_tp} take about {weights:.1f} GiB of the {budget:.1f} GiB it may use "
            f"({utilisation:.0%} of {c.gpu_memory_gb} GiB), leaving {budget - weights:.1f} GiB; one {length}-token "
            f"sequence needs {kv:.1f} GiB of KV cache: vLLM refuses to start.",
            f"lower MAX_MODEL_LEN, or {fix}",
        )
    what = f"vLLM weights at TP {c.gen_tp}" + (f" + KV cache for one {length}-token sequence" if kv else "")
    verdict = _share(weights + kv, budget, f"{what} within {utilisation:.0%} of the GPU", fix)
    if verdict.severity == "ok" and kv:
        room = int((budget - weights) / kv)
        return ok(f"{verdict.message}; the KV cache holds about {room} full-length sequences")
    return verdict


@check("fit.memory_training", FIT, "an out-of-memory crash at the first update", ["train"], needs_facts=True)
def memory_training(ctx: Context) -> Verdict:
    c, facts = ctx.config, ctx.facts
    assert isinstance(c, TrainConfig) and facts is not None
    world = train_world(c)
    if world == 0:
        return skip("no GPUs: a CPU run")
    if facts.num_params is None:
        return skip("config.json does not give the model's shape")
    need = facts.num_params * TRAIN_BYTES_PER_PARAM / world / GIB
    return _share(
        need,
        c.gpu_memory_gb,
        f"FSDP model and optimizer state over {world} GPUs (before activations)",
        "add training GPUs, or use a smaller model.",
    )


#: Tokens a scaffold's agent needs past its prompt: the task's words, the model's first answer, one observation.
SCAFFOLD_ROOM = 512


@check(
    "fit.scaffold_prompt",
    FIT,
    "every trial ends overlong at its first call: the agent's own prompt does not fit the model's context",
    needs_facts=True,
)
def scaffold_prompt(ctx: Context) -> Verdict:
    from runctl import bundles

    assert ctx.facts is not None
    c = ctx.config
    if c.scaffold not in bundles.SPECS:
        return skip(f"SCAFFOLD={c.scaffold}: runctl's own prompt, or the installed agent's, is not measured")
    try:
        prompt = bundles.load(c.scaffold, c.agent_version).prompt()
    except (bundles.BundleError, OSError):
        return skip("the bundle is not built (model.agent_bundle says so) or has no prompt.txt")
    limit = serving_length(c) or ctx.facts.max_position_embeddings
    if limit is None:
        return skip("neither MAX_MODEL_LEN nor the model's config.json gives a context length")
    tokens = _count_tokens(ctx.facts.path, prompt)
    counted = "tokens" if tokens is not None else "tokens (estimated: the model has no tokenizer.json)"
    tokens = tokens if tokens is not None else len(prompt) // 3
    if tokens + SCAFFOLD_ROOM > limit:
        return fatal(
            f"SCAFFOLD={c.scaffold}'s own prompt is {tokens} {counted}; with {SCAFFOLD_ROOM} for the task, the first "
            f"answer and one observation it needs {tokens + SCAFFOLD_ROOM}, but the model serves {limit}.",
            "serve a longer context (MAX_MODEL_LEN, up to the model's limit) or use a model with one; "
            "SCAFFOLD=terminal's prompt is runctl's own and short.",
        )
    return ok(f"SCAFFOLD={c.scaffold}'s prompt is {tokens} {counted} of the {limit} the model serves")


def _count_tokens(model_path: str, text: str) -> int | None:
    from pathlib import Path

    tokenizer_file = Path(model_path) / "tokenizer.json"
    if not tokenizer_file.is_file():
        return None
    from tokenizers import Tokenizer

    return len(Tokenizer.from_file(str(tokenizer_file)).encode(text).ids)
