"""Class 4 (topology, static part) and class 5 (parallelism and batch arithmetic)."""

from __future__ import annotations

from runctl.config import TrainConfig
from services.validator.checks.common import rollout_gpus, step_tasks, train_config, train_nodes, train_world
from services.validator.registry import Context, Verdict, check, fatal, ok, skip
from services.validator.rules import GROUP_ESTIMATORS

TOPOLOGY = 4
PARALLEL = 5


@check("topology.nnodes_sum", TOPOLOGY, "Ray placement waiting forever for nodes that never come", ["train"])
def nnodes_sum(ctx: Context) -> Verdict:
    c = train_config(ctx)
    rollout = c.n_nodes_rollout or 0
    trainer = train_nodes(c)
    if c.training_mode == "async" and rollout < 1:
        return fatal(
            "TRAINING_MODE=async needs its own rollout nodes, but N_NODES_ROLLOUT is 0 or unset.",
            "set N_NODES_ROLLOUT ≥ 1 and N_NODES_TRAIN so that they add up to NNODES.",
        )
    if c.training_mode == "sync" and rollout > 0:
        return fatal(
            f"TRAINING_MODE=sync shares the training nodes for rollout, but N_NODES_ROLLOUT={rollout}.",
            "unset N_NODES_ROLLOUT (sync), or set TRAINING_MODE=async.",
        )
    if trainer < 1 or trainer + rollout != c.nnodes:
        return fatal(
            f"NNODES={c.nnodes} but N_NODES_TRAIN={trainer} + N_NODES_ROLLOUT={rollout} = {trainer + rollout}: "
            "Ray placement would wait forever for nodes that are not there.",
            "make NNODES = N_NODES_TRAIN + N_NODES_ROLLOUT.",
        )
    return ok(f"NNODES={c.nnodes} = {trainer} train + {rollout} rollout")


@check("parallel.tp_divides_heads", PARALLEL, "vLLM refusing to start after the cluster came up", needs_facts=True)
def tp_divides_heads(ctx: Context) -> Verdict:
    facts, tp = ctx.facts, ctx.config.gen_tp
    assert facts is not None
    heads, kv = facts.num_attention_heads, facts.num_key_value_heads
    if not heads or not kv:
        return skip("config.json gives no head counts")
    if heads % tp:
        return fatal(
            f"GEN_TP={tp} does not divide the {heads} attention heads: vLLM will refuse to start.",
            f"use a GEN_TP that divides {heads}.",
        )
    if kv % tp and tp % kv:
        return fatal(
            f"GEN_TP={tp} and the {kv} KV heads neither divide the other: vLLM will refuse to start.",
            f"use a GEN_TP that divides {kv} or is a multiple of it.",
        )
    return ok(f"GEN_TP={tp} divides {heads} attention heads and fits {kv} KV heads")


@check("parallel.gpus_fill_replicas", PARALLEL, "GPUs silently left idle, or replicas that cannot be placed")
def gpus_fill_replicas(ctx: Context) -> Verdict:
    c = ctx.config
    gpus, size = rollout_gpus(c), c.gen_tp * c.gen_dp
    if c.ngpus_per_node == 0:
        return skip("NGPUS_PER_NODE=0: a CPU run places no GPU replicas")
    if size > gpus:
        return fatal(
            f"GEN_TP × GEN_DP = {size} GPUs but only {gpus} serve rollouts: the replicas cannot be placed.",
            "lower GEN_TP or GEN_DP, or add nodes.",
        )
    if gpus % size:
        return fatal(
            f"{gpus} rollout GPUs are not a multiple of GEN_TP × GEN_DP = {size}: {gpus % size} would sit idle.",
            f"choose GEN_TP × GEN_DP dividing {gpus}.",
        )
    return ok(f"{gpus} rollout GPUs hold {c.gen_dp} replica(s) × TP {c.gen_tp} with none idle")


@check("parallel.sp_divides_world", PARALLEL, "a device-mesh error when the trainer starts", ["train"])
def sp_divides_world(ctx: Context) -> Verdict:
    c = train_config(ctx)
    world = train_world(c)
    if c.ngpus_per_node == 0:
        return skip("NGPUS_PER_NODE=0: no GPU world to split")
    if c.sp_size > world or world % c.sp_size:
        return fatal(
            f"SP_SIZE={c.sp_size} does not divide the {world} training GPUs: the device mesh cannot be built.",
            f"use an SP_SIZE that divides {world}.",
        )
    heads = ctx.facts.num_attention_heads if ctx.facts else None
    if heads is not None and heads % c.sp_size:
        return fatal(
            f"SP_SIZE={c.sp_size} does not divide the {heads} attention heads (Ulysses splits heads).",
            f"use an SP_SIZE that divides {heads}.",
        )
    return ok(f"SP_SIZE={c.sp_size} divides {world} training GPUs")


@check("batch.group_size", PARALLEL, "a run whose every advantage is zero, so nothing is learned", ["train"])
def group_size(ctx: Context) -> Verdict:
    c = train_config(ctx)
    if c.adv_estimator in GROUP_ESTIMATORS and c.n_resp < 2:
        return fatal(
            f"ADV_ESTIMATOR={c.adv_estimator} compares a task's responses, but N_RESP={c.n_resp}: "
            "every advantage is zero and nothing is learned.",
            "set N_RESP ≥ 2 (8 is usual).",
        )
    return ok(f"N_RESP={c.n_resp} responses per task")


@check("batch.mini_divides_bsz", PARALLEL, "verl rejecting the batch sizes at start", ["train"])
def mini_divides_bsz(ctx: Context) -> Verdict:
    c = train_config(ctx)
    if c.engine == "local" and "train_mini_bsz" not in c.model_fields_set:
        return skip("ENGINE=local updates once per step on the whole batch")
    if c.training_mode == "async":
        return skip("TRAINING_MODE=async: a step is TRAIN_MINI_BSZ × REQUIRE_BATCHES tasks (TRAIN_BSZ is not used)")
    if c.train_mini_bsz > c.train_bsz or c.train_bsz % c.train_mini_bsz:
        return fatal(
            f"TRAIN_BSZ={c.train_bsz} is not a multiple of TRAIN_MINI_BSZ={c.train_mini_bsz}.",
            "make TRAIN_BSZ a multiple of TRAIN_MINI_BSZ.",
        )
    return ok(f"TRAIN_BSZ={c.train_bsz} = {c.train_bsz // c.train_mini_bsz} × TRAIN_MINI_BSZ")


@check("batch.trials_divide_gpus", PARALLEL, "verl failing after start-up on an uneven split of trials", ["train"])
def trials_divide_gpus(ctx: Context) -> Verdict:
    c = train_config(ctx)
    world, tasks = train_world(c), step_tasks(c)
    trials = tasks * c.n_resp
    name = "TRAIN_MINI_BSZ × REQUIRE_BATCHES" if c.training_mode == "async" else "TRAIN_BSZ"
    if world == 0:
        return skip("NGPUS_PER_NODE=0: no GPU world to split")
    if trials % world:
        return fatal(
            f"{name} × N_RESP = {trials} trials do not split evenly over {world} training GPUs.",
            f"make {name} × N_RESP a multiple of {world}.",
        )
    return ok(f"{trials} trials a step split as {trials // world} per training GPU")


@check("batch.micro_divides_mini", PARALLEL, "a late verl error at the first update step", ["train"])
def micro_divides_mini(ctx: Context) -> Verdict:
    c = train_config(ctx)
    world = train_world(c)
    if c.engine == "local":
        return _local_micro(c)
    if c.use_dynamic_bsz:
        return skip("USE_DYNAMIC_BSZ=1 packs micro-batches by tokens")
    if world == 0:
        return skip("NGPUS_PER_NODE=0: no GPU world to split")
    per_gpu = c.train_mini_bsz * c.n_resp / world
    if per_gpu < c.train_micro_bsz_per_gpu or per_gpu % c.train_micro_bsz_per_gpu:
        return fatal(
            f"a mini-batch gives {per_gpu:g} samples per GPU (TRAIN_MINI_BSZ × N_RESP ÷ {world} GPUs), "
            f"not a multiple of TRAIN_MICRO_BSZ_PER_GPU={c.train_micro_bsz_per_gpu}.",
            "change TRAIN_MINI_BSZ or TRAIN_MICRO_BSZ_PER_GPU, or set USE_DYNAMIC_BSZ=1.",
        )
    return ok(f"{per_gpu:g} samples per GPU per mini-batch in micro-batches of {c.train_micro_bsz_per_gpu}")


def _local_micro(c: TrainConfig) -> Verdict:
    """ENGINE=local: one process updates on the step's TRAIN_BSZ × N_RESP samples, in micro-batches when asked."""
    samples = c.train_bsz * c.n_resp
    if "train_micro_bsz_per_gpu" not in c.model_fields_set:
        return skip(f"ENGINE=local updates on the step's {samples} samples in one pass (TRAIN_MICRO_BSZ_PER_GPU unset)")
    micro = c.train_micro_bsz_per_gpu
    if samples % micro:
        fits = [m for m in range(1, samples + 1) if samples % m == 0]
        return fatal(
            f"a step gives {samples} samples (TRAIN_BSZ × N_RESP), not a multiple of TRAIN_MICRO_BSZ_PER_GPU={micro}.",
            f"set TRAIN_MICRO_BSZ_PER_GPU to one of {', '.join(map(str, fits))}, or change TRAIN_BSZ or N_RESP.",
        )
    return ok(f"{samples} samples a step in {samples // micro} micro-batches of {micro}, gradients accumulated")
