"""Stands in for verl's trainer where no GPU is (verl cannot train without one): started by the runner exactly as
verl's entry point is, it composes verl's config from the same overrides with verl's own YAML, takes the environment
Ray's runtime_env gives verl's TaskRunner, then writes what verl's trainer writes, where verl writes it — a
file-logger line per step through verl's own ``FileLogger`` (which truncates the file, as a resumed verl does),
``global_step_N/actor/huggingface`` and ``latest_checkpointed_iteration.txt`` every ``save_freq`` steps — and calls
the checkpoint callback verl's own ``build_checkpoint_callback`` makes from the config. It resumes from the latest
checkpoint as verl does with ``resume_mode=auto``; ``STAND_IN_DIE_AFTER=N`` makes it die (exit 1) after step N.

Its figures differ between a first run and a resumed one, so a test can tell which were published.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(overrides: list[str]) -> int:
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
    from verl.utils.tracking import FileLogger

    from services.validator.checks.verl_schema import verl_config_dir

    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    # verl's trainer runs in a Ray actor (its TaskRunner), whose environment is the runtime_env's: as there.
    os.environ.update({k: str(v) for k, v in config.ray_kwargs.ray_init.runtime_env.get("env_vars", {}).items()})
    trainer = config.trainer
    root = Path(trainer.default_local_dir)
    latest = root / "latest_checkpointed_iteration.txt"
    start = int(latest.read_text()) if latest.is_file() else 0
    resumed = 0.5 if start else 0.0
    logger = FileLogger(trainer.project_name, trainer.experiment_name)
    callback = build_checkpoint_callback(config)
    die_after = int(os.environ.get("STAND_IN_DIE_AFTER", "0"))
    for step in range(start + 1, trainer.total_training_steps + 1):
        figures = {"critic/score/mean": step / 10 + resumed, "actor/pg_loss": -step / 100, "training/global_step": step}
        logger.log({**figures, "val/generations": [["a sample"]]}, step=step)
        if step % trainer.save_freq == 0 or step == trainer.total_training_steps:
            folder = root / f"global_step_{step}"
            hf = folder / "actor" / "huggingface"
            hf.mkdir(parents=True, exist_ok=True)
            (hf / "config.json").write_text("{}")
            (hf / "model.safetensors").write_bytes(b"\0" * 1000 * step)
            latest.write_text(str(step))
            callback.on_save(trainer=None, global_step=step, checkpoint_dir=str(folder), async_save=False)
        if step == die_after:
            os._exit(1)
    logger.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
