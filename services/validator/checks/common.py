"""Derived quantities several checks share: node and GPU counts per role, and the serving length."""

from __future__ import annotations

from runctl.config.models import RunConfig, TrainConfig
from services.validator.registry import Context


def train_config(ctx: Context) -> TrainConfig:
    """The config of a train-only check (the registry runs those on train runs alone)."""
    assert isinstance(ctx.config, TrainConfig)
    return ctx.config


def train_nodes(config: TrainConfig) -> int:
    """Nodes the trainer gets: N_NODES_TRAIN, else what rollout leaves of NNODES."""
    if config.n_nodes_train is not None:
        return config.n_nodes_train
    return config.nnodes - (config.n_nodes_rollout or 0)


def rollout_gpus(config: RunConfig) -> int:
    """GPUs serving rollouts: the rollout nodes in async mode, every node otherwise (sync shares them)."""
    if isinstance(config, TrainConfig) and config.training_mode == "async":
        return (config.n_nodes_rollout or 0) * config.ngpus_per_node
    return config.nnodes * config.ngpus_per_node


def step_tasks(config: TrainConfig) -> int:
    """Tasks a training step learns from: TRAIN_BSZ, or in async mode (verl's rollouter feeds tasks one at a time)
    TRAIN_MINI_BSZ × REQUIRE_BATCHES."""
    if config.training_mode == "async":
        return config.train_mini_bsz * config.require_batches
    return config.train_bsz


def train_world(config: TrainConfig) -> int:
    return train_nodes(config) * config.ngpus_per_node


def serving_length(config: RunConfig) -> int | None:
    """vLLM's max model length: MAX_MODEL_LEN, else prompt + response for train runs."""
    if config.max_model_len is not None:
        return config.max_model_len
    if isinstance(config, TrainConfig):
        return config.max_prompt + config.max_resp
    return None
