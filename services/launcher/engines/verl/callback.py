"""``checkpoint.saved`` from verl's own hook: ``trainer.checkpoint_callback_class`` names ``CheckpointAnnouncer``.
(verl's fully async trainer calls no such hook: there the runner announces each step its tracker file names,
through the same class.)

verl's trainer calls ``on_save`` on its driver after each save, with the ``global_step_N`` folder. runctl asks verl to
write a Hugging Face folder beside the FSDP shards (``hf_model`` in the actor's ``save_contents``), so the event names
``global_step_N/actor/huggingface``: a folder an eval run serves as its model, with no merge. verl lets an exception in
this hook abort training; this one never raises: whatever goes wrong is logged and handed on as ``plugin.failed``
(the checkpoint itself is on disk all the same, and a later checkpoint is announced as usual).

Nothing here imports verl (the hook is duck-typed, as verl's loader allows), so it is tested without it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from runctl.events import CheckpointSaved, PluginFailed
from services.launcher.engines.verl.outbox import post
from services.launcher.trainer.checkpoints import VERL_HF, folder_bytes

log = logging.getLogger(__name__)


def run_dir_of(default_local_dir: str) -> Path:
    """The run folder: runctl sets verl's ``trainer.default_local_dir`` to ``<run>/checkpoints``."""
    return Path(default_local_dir).parent


class CheckpointAnnouncer:
    """verl's checkpoint callback: each saved step becomes one ``checkpoint.saved`` (key ``checkpoint.<N>``)."""

    def __init__(self, config: Any = None) -> None:
        self.config = config
        self.run_dir = run_dir_of(str(config.trainer.default_local_dir)) if config is not None else None

    @classmethod
    def for_run(cls, run_dir: Path) -> CheckpointAnnouncer:
        """The announcer the runner itself uses where verl calls no callback (its fully async trainer)."""
        announcer = cls()
        announcer.run_dir = run_dir
        return announcer

    def on_save(self, trainer: Any = None, global_step: int = 0, checkpoint_dir: str = "", **kwargs: Any) -> None:
        """Announce one checkpoint; never raises into verl's trainer."""
        try:
            self._announce(int(global_step), Path(checkpoint_dir), bool(kwargs.get("async_save", False)))
        except Exception as e:  # a hook must not end the training: say so instead
            log.exception("runctl could not announce the checkpoint of step %s", global_step)
            self._failed(global_step, e)

    def _announce(self, step: int, folder: Path, async_save: bool) -> None:
        if self.run_dir is None:
            raise RuntimeError("verl gave the callback no config, so runctl cannot find the run folder")
        hf = folder / VERL_HF
        if async_save:
            raise RuntimeError(
                f"step {step} was saved asynchronously: its files may still be in flight, so it is not announced. "
                "Fix: leave actor_rollout_ref.actor.checkpoint.async_save off (runctl does not set it)"
            )
        if not (hf / "config.json").is_file():
            raise FileNotFoundError(
                f"step {step}'s checkpoint has no Hugging Face folder at {hf}, so no eval run can serve it. Fix: keep "
                "hf_model in actor_rollout_ref.actor.checkpoint.save_contents (runctl's overrides set it)"
            )
        payload = CheckpointSaved(step=step, path=str(hf), format="hf", num_bytes=folder_bytes(folder))
        post(self.run_dir, f"checkpoint.{step}", payload)
        log.info("runctl: checkpoint of step %d announced (%s)", step, hf)

    def _failed(self, step: Any, error: Exception) -> None:
        if self.run_dir is None:
            return
        try:
            failure = PluginFailed(
                plugin="checkpoint_callback",
                step=int(step),
                error_type=type(error).__name__,
                message=f"the checkpoint of step {step} was saved but not announced (no eval run of it): {error}",
            )
            post(self.run_dir, f"plugin.checkpoint_callback.{step}", failure)
        except Exception:  # the outbox itself is unwritable: the log line above is all there is
            log.exception("runctl could not record the failure either")
