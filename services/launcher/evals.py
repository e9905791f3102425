"""Evaluation on every checkpoint: each ``checkpoint.saved`` of a train run with ``EVAL_ON_CHECKPOINT=1`` becomes
one eval run of that checkpoint on ``EVAL_DATASET``, submitted through the normal path (``config.submitted`` →
the validator → ``config.validated`` → admission), and ``eval.requested`` links the two.

The base model is scored too, as step 0, when the train run is admitted. Exactly once per checkpoint: the eval
run's id is derived from the parent and the step (``<parent>-eval-s<step>``), and its entry in the ``runctl_evals``
KV bucket is *created* (a second create fails), so a redelivered event, a duplicate ``checkpoint.saved`` and a
restarted launcher all find it there. The submission itself is looked up before it is published.

At most ``RUNCTL_MAX_EVALS_IN_FLIGHT`` eval runs (a site setting, default 2) are in flight at once across the
stack; the others wait, queued in step order, and are submitted as earlier ones end. Eval runs of a cancelled
train run still run to the end: each names its parent run and step (``PARENT_RUN``, ``CHECKPOINT_STEP``).

When an eval run ends, its checkpoint is no longer pinned, and the parent's checkpoints beyond
``MAX_CKPT_TO_KEEP`` are pruned (the runner prunes at each save, but never a checkpoint whose eval is running).
"""

from __future__ import annotations

import logging
from pathlib import Path

import nats.js.errors

from runctl.config.envfile import quote
from runctl.config.loader import load_config
from runctl.config.models import TrainConfig, is_secret, keys_for
from runctl.errors import ConfigError, RunctlError
from runctl.events import CheckpointSaved, ConfigSubmitted, EvalRequested, Event
from runctl.events.payloads import RUNS_STREAM
from runctl.sdk import submission_event
from runctl.subjects import event_subject, team_stream
from services.launcher.carry.books import Books, failing_checks
from services.launcher.carry.lifecycle import run_dir_for
from services.launcher.evalstore import EvalEntry, EvalStore, eval_run_id
from services.launcher.trainer import checkpoints

log = logging.getLogger(__name__)

#: Keys an eval run of a checkpoint is given its own value for (the rest come from the train run, where they apply).
OWN_KEYS = {"RUN_TYPE", "EXP_NAME", "MODEL_PATH", "DATASET_PATH", "N_TRIALS", "EVAL_TEMPERATURE", "N_CONCURRENT"}
OWN_KEYS |= {"PARENT_RUN", "CHECKPOINT_STEP", "OUTPUT_DIR", "VLLM_READY_TIMEOUT", "ENGINE"}


def eval_config_text(parent: ConfigSubmitted, parent_run: str, config: TrainConfig, step: int, checkpoint: str) -> str:
    """The ``.env`` of the eval run of one checkpoint: the train run's own settings where an eval run has them (its
    agent, sandbox, cluster and model-serving keys), the checkpoint as MODEL_PATH, EVAL_DATASET as DATASET_PATH.
    Secrets are not copied (they never travel on the bus)."""
    eval_keys = set(keys_for("eval"))
    lines = [f"# The eval run of checkpoint step {step} of train run {parent.exp_name}, written by the launcher."]
    for key, row in sorted(parent.resolved.items()):
        if key in OWN_KEYS or key not in eval_keys or row.get("layer") == "default" or is_secret("eval", key):
            continue
        value = row.get("value")
        if value is not None:
            lines.append(f"{key}={quote(value)}")
    own = {
        "RUN_TYPE": "eval",
        # ENGINE=local serves the checkpoint with vLLM (on a GPU for a verl run's): verl carries train runs only.
        "ENGINE": "local",
        "EXP_NAME": f"{config.exp_name}-eval-step{step}",
        "MODEL_PATH": checkpoint,
        "DATASET_PATH": str(config.eval_dataset),
        "N_TRIALS": str(config.eval_n_trials),
        "EVAL_TEMPERATURE": str(config.eval_temperature),
        "N_CONCURRENT": str(config.agent_num_workers),
        "VLLM_READY_TIMEOUT": str(config.vllm_ready_timeout),
        "PARENT_RUN": parent_run,
        "CHECKPOINT_STEP": str(step),
    }
    lines += [f"{k}={quote(v)}" for k, v in own.items()]
    return "\n".join(lines) + "\n"


class Evals:
    """The launcher's part: see the module docstring."""

    def __init__(self, books: Books, store: EvalStore, max_in_flight: int = 2) -> None:
        self.books = books
        self.store = store
        self.max_in_flight = max_in_flight
        """RUNCTL_MAX_EVALS_IN_FLIGHT (settings.LauncherSettings)."""
        self.dropped = 0
        self.checked: dict[str, bool] = {}
        """Foreground runs checked (run id → whether their config passed the validator's static checks)."""
        """checkpoint.saved events naming a folder outside their run's: nothing is evaluated (or pruned) for them."""

    async def on_admitted(self, team: str, run_id: str, config: TrainConfig) -> None:
        """A train run with EVAL_ON_CHECKPOINT=1 was admitted: its base model is scored as step 0, so that the first
        point of its eval curve is where training started."""
        if not config.eval_on_checkpoint or config.engine == "fake":
            return
        entry = EvalEntry(run_id, team, 0, str(config.model_path), eval_run_id(run_id, 0))
        if await self.store.create(entry):
            log.info("%s: its base model queued for an eval run (%s)", run_id, entry.eval_run)
        await self.dispatch()

    async def on_checkpoint(self, event: Event) -> None:
        data = event.data
        assert isinstance(data, CheckpointSaved)
        try:
            # A run `runctl run` carries on the stack's bus gets its evals too.
            submitted, config = await self.books.submitted_config(event.team, event.runid, foreground_too=True)
        except RunctlError:
            return  # no submission to read (or one that no longer validates): nothing to evaluate
        if not isinstance(config, TrainConfig) or not config.eval_on_checkpoint or data.synthetic:
            return
        if submitted.via == "foreground" and not await self._passes_checks(event.runid, config):
            return
        run_dir = run_dir_for(event.team, event.runid, config).resolve()
        if run_dir not in Path(data.path).resolve().parents:
            log.warning(
                "%s: checkpoint.saved names %s, outside the run's folder %s: no eval run of it (dropped)",
                event.runid,
                data.path,
                run_dir,
            )
            self.dropped += 1
            return
        entry = EvalEntry(event.runid, event.team, data.step, data.path, eval_run_id(event.runid, data.step))
        if await self.store.create(entry):
            log.info("%s: checkpoint of step %d queued for its eval run %s", event.runid, data.step, entry.eval_run)
        await self.dispatch()

    async def _passes_checks(self, run_id: str, config: TrainConfig) -> bool:
        """A run ``runctl run`` carries was never checked by the validator service: before the launcher writes eval
        configs into its folder or prunes checkpoints there, its config passes the validator's static checks (its
        folders inside its team's, say). Once per run."""
        if run_id not in self.checked:
            fatal = await failing_checks(config)
            if fatal:
                log.warning(
                    "%s: no eval runs of its checkpoints, its config fails checks: %s", run_id, "; ".join(fatal)
                )
            self.checked[run_id] = not fatal
        if not self.checked[run_id]:
            self.dropped += 1
        return self.checked[run_id]

    async def on_end(self, event: Event) -> None:
        """An eval run ended: its checkpoint is unpinned (and may be pruned), and the next queued eval goes."""
        for entry in await self.store.entries():
            # Keyed by (team, run): another team's end event naming the same run id unpins nothing.
            if entry.eval_run == event.runid and entry.team == event.team and entry.state != "ended":
                entry.state, entry.outcome = "ended", event.name
                await self.store.put(entry)
                await self.prune(entry)
        await self.dispatch()

    async def dispatch(self) -> None:
        entries = await self.store.entries()
        room = self.max_in_flight - sum(1 for e in entries if e.state == "submitted")
        for entry in [e for e in entries if e.state == "queued"][: max(0, room)]:
            await self.submit(entry)

    async def submit(self, entry: EvalEntry) -> None:
        """Publish the eval run's submission (once: it is looked up first) and ``eval.requested``."""
        if not await self._submitted(entry):
            submitted, config = await self.books.submitted_config(entry.team, entry.parent, foreground_too=True)
            assert isinstance(config, TrainConfig)
            folder = run_dir_for(entry.team, entry.parent, config) / "evals"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"step_{entry.step}.env"
            path.write_text(eval_config_text(submitted, entry.parent, config, entry.step, entry.checkpoint))
            try:
                resolved = load_config(path)
            except ConfigError as e:
                log.error("%s: the eval run of step %d cannot be made: %s", entry.parent, entry.step, e)
                entry.state, entry.outcome = "ended", "config.invalid"
                await self.store.put(entry)
                return
            await self.books.bus.publish(submission_event(resolved, via="launcher", run_id=entry.eval_run))
        requested = EvalRequested(parent_run=entry.parent, checkpoint_step=entry.step, eval_run_id=entry.eval_run)
        await self.books.publish(requested, entry.team, entry.parent, f"eval.{entry.step}")
        entry.state = "submitted"
        await self.store.put(entry)

    async def _submitted(self, entry: EvalEntry) -> bool:
        subject = event_subject(entry.team, entry.eval_run, ConfigSubmitted.event_name)
        try:
            await self.books.bus.js.get_last_msg(team_stream(RUNS_STREAM, entry.team), subject)
        except nats.js.errors.NotFoundError:
            return False
        return True

    async def prune(self, entry: EvalEntry) -> None:
        try:
            _, config = await self.books.submitted_config(entry.team, entry.parent, foreground_too=True)
        except RunctlError:
            return
        if isinstance(config, TrainConfig) and config.max_ckpt_to_keep is not None:
            run_dir = run_dir_for(entry.team, entry.parent, config)
            pinned = await self.store.pinned(entry.parent)
            deleted = checkpoints.prune(Path(run_dir), config.max_ckpt_to_keep, pinned, checkpoints.hf_of(config))
            if deleted:
                log.info("%s: MAX_CKPT_TO_KEEP: deleted checkpoints of steps %s", entry.parent, deleted)
