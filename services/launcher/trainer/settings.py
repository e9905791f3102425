"""A train config mapped onto TRL's ``GRPOConfig`` (pure: no TRL import, so the validator and the tests can ask).

One optimizer step per runctl step: a step takes ``TRAIN_BSZ`` tasks, runs ``N_RESP`` trials of each, and updates
on all of them (``num_generations = N_RESP``): in one forward and backward pass, or, with
``TRAIN_MICRO_BSZ_PER_GPU`` set, in micro-batches of that many samples whose gradients are accumulated
(``per_device_train_batch_size`` = the micro-batch, ``gradient_accumulation_steps = steps_per_generation`` = their
number, so TRL takes the step's whole batch from one rollout and normalises the loss over all of its tokens).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from runctl.config import TrainConfig

#: The clip range each loss mode is used with when CLIP_RATIO_LOW / CLIP_RATIO_HIGH are unset: PPO's 0.2 for the
#: token-level loss (DAPO's 0.28 above), and GSPO's paper values for the sequence-level ratio, which sits much
#: closer to 1.
DEFAULT_CLIP: dict[str, tuple[float, float]] = {"vanilla": (0.2, 0.28), "gspo": (3e-4, 4e-4)}
#: LR_SCHEDULER → the transformers scheduler (each with LR_WARMUP_STEPS of linear warm-up).
SCHEDULERS = {"constant": "constant_with_warmup", "cosine": "cosine", "linear": "linear"}
#: POLICY_LOSS_MODE → TRL's importance-sampling level.
IMPORTANCE_LEVEL = {"vanilla": "token", "gspo": "sequence"}


@dataclass(frozen=True)
class StepShape:
    tasks: int
    responses: int

    micro: int
    """Samples in one forward and backward pass."""

    @property
    def samples(self) -> int:
        return self.tasks * self.responses

    @property
    def passes(self) -> int:
        return self.samples // self.micro


def step_shape(config: TrainConfig) -> StepShape:
    """The step's shape: the whole batch in one pass unless TRAIN_MICRO_BSZ_PER_GPU is set (the validator holds
    that it divides TRAIN_BSZ × N_RESP)."""
    samples = config.train_bsz * config.n_resp
    micro = config.train_micro_bsz_per_gpu if "train_micro_bsz_per_gpu" in config.model_fields_set else samples
    return StepShape(config.train_bsz, config.n_resp, micro)


def clip_range(config: TrainConfig) -> tuple[float, float]:
    low, high = DEFAULT_CLIP.get(config.policy_loss_mode, DEFAULT_CLIP["vanilla"])
    return (
        config.clip_ratio_low if config.clip_ratio_low is not None else low,
        config.clip_ratio_high if config.clip_ratio_high is not None else high,
    )


def kl_coef(config: TrainConfig) -> float:
    return config.kl_loss_coef if config.use_kl_loss else 0.0


@dataclass(frozen=True)
class Plan:
    """How many steps the run makes: TOTAL_TRAINING_STEPS when set (the data is then gone through as often as it
    takes), else TOTAL_EPOCHS passes of the tasks in batches of TRAIN_BSZ (a last, partial batch is dropped)."""

    steps_per_epoch: int
    total_steps: int


def plan(config: TrainConfig, num_tasks: int) -> Plan:
    per_epoch = num_tasks // config.train_bsz
    return Plan(per_epoch, config.total_training_steps or per_epoch * config.total_epochs)


def task_order(config: TrainConfig, task_ids: list[str], seed: int = 0) -> list[str]:
    """Every step's tasks, in order, for the whole run: each epoch a fresh shuffle (seeded by the epoch), its last
    partial batch dropped. runctl fixes the order itself rather than leave it to TRL's sampler, whose generator a
    resumed trainer does not restore, so a run resumed in a later epoch would see another order."""
    steps = plan(config, len(task_ids))
    if steps.steps_per_epoch == 0:
        return []
    order: list[str] = []
    epoch = 0
    while len(order) < steps.total_steps * config.train_bsz:
        shuffled = list(task_ids)
        random.Random(f"{seed}:{epoch}").shuffle(shuffled)
        order += shuffled[: steps.steps_per_epoch * config.train_bsz]
        epoch += 1
    return order[: steps.total_steps * config.train_bsz]


def grpo_kwargs(config: TrainConfig, output_dir: str, num_tasks: int, seed: int = 0) -> dict[str, Any]:
    """The ``GRPOConfig`` arguments for a train run. Checkpoints are written every step (the resume point: a run
    loses at most the step in flight); which of them become published checkpoints is runctl's choice
    (``checkpoints.py``). The data is one unshuffled pass over :func:`task_order`, so a resumed trainer skips
    exactly the steps it made."""
    low, high = clip_range(config)
    shape = step_shape(config)
    kwargs: dict[str, Any] = {
        "output_dir": output_dir,
        "use_cpu": config.ngpus_per_node == 0,
        "bf16": False,
        "seed": seed,
        "data_seed": seed,
        "learning_rate": config.actor_lr,
        "lr_scheduler_type": SCHEDULERS[config.lr_scheduler],
        "warmup_steps": config.lr_warmup_steps,
        "per_device_train_batch_size": shape.micro,
        "gradient_accumulation_steps": shape.passes,
        "num_generations": shape.responses,
        "steps_per_generation": shape.passes,
        "num_iterations": 1,
        "beta": kl_coef(config),
        "epsilon": low,
        "epsilon_high": high,
        "importance_sampling_level": IMPORTANCE_LEVEL[config.policy_loss_mode],
        "loss_type": "dapo",
        "entropy_coef": config.entropy_coeff,
        "temperature": config.temperature,
        "max_completion_length": config.max_resp,
        "num_train_epochs": 1,
        "max_steps": plan(config, num_tasks).total_steps,
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": 1,
        "save_only_model": False,
        "report_to": [],
        "disable_tqdm": True,
        "shuffle_dataset": False,
        "dataloader_num_workers": 0,
        "remove_unused_columns": False,
    }
    return kwargs
