"""Stands in for verl's trainer where no GPU is (verl cannot train without one): started by the runner exactly as
verl's entry point is, it composes verl's config from the same overrides with verl's own YAML, takes the environment
Ray's runtime_env gives verl's TaskRunner, then writes what verl's trainer writes, where verl writes it — a
file-logger line per step through verl's own ``FileLogger`` (which truncates the file, as a resumed verl does),
``global_step_N/actor/huggingface`` and ``latest_checkpointed_iteration.txt`` every ``save_freq`` steps — and calls
the checkpoint callback verl's own ``build_checkpoint_callback`` makes from the config. Given the fully async
trainer's overrides it composes that tree and, as that trainer, counts its steps from the rollouts and calls no
callback. It resumes from the latest
checkpoint as verl does with ``resume_mode=auto``; ``STAND_IN_DIE_AFTER=N`` makes it die (exit 1) after step N.

Its figures differ between a first run and a resumed one, so a test can tell which were published.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(overrides: list[str]) -> int:
    import importlib

    from omegaconf import OmegaConf
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
    from verl.utils.tracking import FileLogger

    from runctl.verl import ASYNC_CONFIG_FOLDER, ASYNC_CONFIG_NAME
    from services.validator.checks.verl_schema import compose, verl_config_dir

    fully_async = any(o.startswith("async_training.") for o in overrides)
    folder = verl_config_dir(ASYNC_CONFIG_FOLDER) if fully_async else verl_config_dir()
    assert folder is not None, "verl's config files are not installed"
    config = compose(folder, overrides, ASYNC_CONFIG_NAME) if fully_async else compose(folder, overrides)
    # verl's trainer runs in a Ray actor (its TaskRunner), whose environment is the runtime_env's: as there, where
    # verl hands ray.init that part of its config unresolved, and Ray calls the runner's hook (RAY_RUNTIME_ENV_HOOK).
    runtime_env = OmegaConf.to_container(config.ray_kwargs.ray_init.runtime_env)
    if os.environ.get("RAY_RUNTIME_ENV_HOOK"):
        module, _, name = os.environ["RAY_RUNTIME_ENV_HOOK"].rpartition(".")
        runtime_env = getattr(importlib.import_module(module), name)(runtime_env)
    os.environ.update({k: str(v) for k, v in (runtime_env.get("env_vars") or {}).items()})  # type: ignore[union-attr]
    trainer = config.trainer
    root = Path(trainer.default_local_dir)
    latest = root / "latest_checkpointed_iteration.txt"
    start = int(latest.read_text()) if latest.is_file() else 0
    resumed = 0.5 if start else 0.0
    logger = FileLogger(trainer.project_name, trainer.experiment_name)
    callback = None if fully_async else build_checkpoint_callback(config)
    total = trainer.total_training_steps
    if fully_async:  # as verl's rollouter counts them (fully_async_rollouter.py)
        sync = config.async_training
        per_step = config.actor_rollout_ref.actor.ppo_mini_batch_size * sync.require_batches
        total = config.rollout.total_rollout_steps // (per_step * sync.trigger_parameter_sync_step)
    die_after = int(os.environ.get("STAND_IN_DIE_AFTER", "0"))
    for step in range(start + 1, total + 1):
        figures = {"critic/score/mean": step / 10 + resumed, "actor/pg_loss": -step / 100, "training/global_step": step}
        logger.log({**figures, "val/generations": [["a sample"]]}, step=step)
        if step % trainer.save_freq == 0 or step == total:
            folder = root / f"global_step_{step}"
            hf = folder / "actor" / "huggingface"
            hf.mkdir(parents=True, exist_ok=True)
            (hf / "config.json").write_text("{}")
            (hf / "model.safetensors").write_bytes(b"\0" * 1000 * step)
            latest.write_text(str(step))
            if callback is not None:
                callback.on_save(trainer=None, global_step=step, checkpoint_dir=str(folder), async_save=False)
        if step == die_after:
            os._exit(1)
    logger.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
