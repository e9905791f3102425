"""A train config as verl sees it: the Hydra overrides and the launch command the runner uses for ENGINE=verl.

Part of the contract because two services need the same answer: the validator composes these overrides against
verl's own config tree before a GPU is touched, and the launcher's verl engine launches with them.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from runctl.config.models import TrainConfig

ENTRYPOINT = "verl.trainer.main_ppo"
CONFIG_NAME = "ppo_trainer"
_PLAIN = re.compile(r"[A-Za-z0-9_./:@+-]*")


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: booleans and null as Hydra spells them, lists in brackets, and
    anything with a character the grammar reserves in single quotes."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.fullmatch(text) and text not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def verl_overrides(config: TrainConfig, run_dir: str) -> list[str]:
    """The ``key=value`` overrides of verl's ``ppo_trainer`` config for a sync train run."""
    utilisation = config.gpu_mem_util or (0.85 if config.training_mode == "async" else 0.6)
    loggers = [name.strip() for name in config.logger.split(",") if name.strip()]
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    values: dict[str, Any] = {
        "algorithm.adv_estimator": config.adv_estimator,
        "data.train_files": config.train_files,
        "data.val_files": config.val_files or config.train_files,
        "data.train_batch_size": config.train_bsz,
        "data.max_prompt_length": config.max_prompt,
        "data.max_response_length": config.max_resp,
        "actor_rollout_ref.model.path": config.model_path,
        "actor_rollout_ref.model.use_remove_padding": True,
        f"{actor}.ppo_mini_batch_size": config.train_mini_bsz,
        f"{actor}.ppo_micro_batch_size_per_gpu": config.train_micro_bsz_per_gpu,
        f"{actor}.use_dynamic_bsz": config.use_dynamic_bsz,
        f"{actor}.use_kl_loss": config.use_kl_loss,
        f"{actor}.kl_loss_coef": config.kl_loss_coef,
        f"{actor}.entropy_coeff": config.entropy_coeff,
        f"{actor}.policy_loss.loss_mode": config.policy_loss_mode,
        f"{actor}.ulysses_sequence_parallel_size": config.sp_size,
        f"{actor}.optim.lr": config.actor_lr,
        f"{actor}.optim.lr_scheduler_type": config.lr_scheduler,
        f"{actor}.optim.lr_warmup_steps": config.lr_warmup_steps,
        f"{rollout}.name": "vllm",
        f"{rollout}.tensor_model_parallel_size": config.gen_tp,
        f"{rollout}.n": config.n_resp,
        f"{rollout}.gpu_memory_utilization": utilisation,
        f"{rollout}.temperature": config.temperature,
        f"{rollout}.val_kwargs.temperature": config.val_temperature,
        f"{rollout}.max_model_len": config.max_model_len or config.max_prompt + config.max_resp,
        f"{rollout}.enable_rollout_routing_replay": config.enable_r3,
        f"{rollout}.agent.num_workers": config.agent_num_workers,
        "trainer.nnodes": config.nnodes,
        "trainer.n_gpus_per_node": config.ngpus_per_node,
        "trainer.save_freq": config.save_freq,
        "trainer.test_freq": config.test_freq,
        "trainer.total_epochs": config.total_epochs,
        "trainer.total_training_steps": config.total_training_steps,
        "trainer.val_before_train": config.val_before_train,
        "trainer.logger": loggers,
        "trainer.project_name": config.project_name,
        "trainer.experiment_name": config.exp_name,
        "trainer.default_local_dir": f"{run_dir}/checkpoints",
        "trainer.max_actor_ckpt_to_keep": config.max_ckpt_to_keep,
    }
    return [f"{key}={hydra_value(value)}" for key, value in values.items()]


def launch_command(config: TrainConfig, run_dir: str, python: str = "python3") -> str:
    """The fully expanded command line the runner starts verl with, shell-quoted."""
    argv = [python, "-m", ENTRYPOINT, *verl_overrides(config, run_dir)]
    return " ".join(shlex.quote(arg) for arg in argv)
