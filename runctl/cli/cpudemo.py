"""The CPU demo (``./scripts/demo.sh``, ``runctl demo --cpu``): the whole loop through the embedded stack.

An infer run scores the example tasks and writes the filtered index (the tasks the tiny model solves sometimes);
a train run does GRPO on that index, and the launcher submits an eval run on every checkpoint (the base model as
step 0) on the same tasks; once the train run is over, two eval runs score the base model and the last checkpoint
on the held-out tasks. It ends with one line per checkpoint — step, pass@1 with its 95 % interval, beside the base
model's — the held-out line, and the dashboard's URL. Every run is submitted, validated and admitted as any other;
the configs it submits are written to ``$RUNCTL_HOME/demo/`` so that what ran can be read back.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from runctl.config import TrainConfig
from runctl.config.loader import load_config
from runctl.errors import RunctlError
from runctl.events import Event
from runctl.events.payloads import CheckpointSaved, RunSucceeded
from runctl.sdk import RunctlClient

INFER = Path("configs/examples/infer-cpu.env")
TRAIN = Path("configs/examples/train-cpu.env")
EVAL = Path("configs/examples/eval-cpu.env")
HELDOUT = Path("examples/tasks-heldout")
#: The infer example as the demo runs it: at the train run's temperature, with enough trials that the filter's verdict
#: is not luck, and a band that keeps the task the tiny model solves about half the time and drops the ones it nearly
#: always solves (nothing to learn there).
INFER_SETTINGS = {"N_TRIALS": "16", "TEMPERATURE": "0.7", "FILTER_MIN_PASS_RATE": "0.0", "FILTER_MAX_PASS_RATE": "0.8"}
ENDS = ("run.succeeded", "run.failed", "run.cancelled", "config.rejected")


class DemoError(RunctlError):
    """A run of the demo did not end as the next one needs."""


@dataclass(frozen=True)
class Score:
    """An eval run's pass@1 and its 95 % Wilson interval, as the run reported them."""

    run_id: str
    pass_at_1: float
    low: float
    high: float
    trials: int

    def text(self) -> str:
        return f"{self.pass_at_1:.2f} [{self.low:.2f}, {self.high:.2f}] ({self.trials} trials)"


def with_settings(text: str, values: dict[str, str]) -> str:
    """``text`` (a ``.env``) with each key of ``values`` set: its line replaced where it has one, appended if not."""
    lines = text.splitlines()
    for key, value in values.items():
        pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
        found = [i for i, line in enumerate(lines) if pattern.match(line)]
        for i in found:
            lines[i] = f"{key}={value}"
        if not found:
            lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def score_of(run_id: str, ending: Event) -> Score:
    """The pass@1 of an eval run from its ``run.succeeded``.

    Raises:
        DemoError: the run did not succeed, or reported no pass@1.
    """
    if not isinstance(ending.data, RunSucceeded):
        raise DemoError(f"eval run {run_id} ended with {ending.name}. Fix: see `runctl show {run_id}`.")
    summary: dict[str, Any] = ending.data.summary
    rate, interval = summary.get("pass@1"), summary.get("pass@1_ci95")
    if rate is None or not interval:
        raise DemoError(f"eval run {run_id} completed no trial. Fix: see `runctl show {run_id}`.")
    return Score(run_id, float(rate), float(interval[0]), float(interval[1]), int(summary.get("completed", 0)))


class Demo:
    def __init__(self, client: RunctlClient, console: Console, folder: Path) -> None:
        self.client = client
        self.console = console
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def write_config(self, example: Path, name: str, values: dict[str, str]) -> Path:
        path = self.folder / f"{name}.env"
        path.write_text(with_settings(example.read_text(), values))
        return path

    async def submit(self, config: Path) -> str:
        from runctl.cli.app import checks, refuse_fatal

        resolved = load_config(config)
        # The live checks run their own event loop: in a thread of their own, beside this one.
        refuse_fatal(await asyncio.to_thread(checks, resolved, True), "nothing was published or launched")
        submitted = await self.client.submit(resolved, via="cli")
        self.console.print(f"submitted [bold]{submitted.run_id}[/] ({config})")
        return submitted.run_id

    async def follow(self, run_id: str, label: str, *, trials: bool, seen: list[Event] | None = None) -> Event:
        """Print a run's events, each after ``label``, until it ends (trial lines only when ``trials``); its last
        event."""
        from runctl.cli.render import event_line

        last: Event | None = None
        async for event in self.client.watch(run_id, include_trials=trials):
            last = event
            if seen is not None:
                seen.append(event)
            if trials or event.name != "trial.finished":
                self.console.print(f"{label:<16} {event_line(event)}")
        if last is None or last.name not in ENDS:
            raise DemoError(f"run {run_id}'s events stopped before it ended. Fix: see `runctl show {run_id}`.")
        return last

    async def infer(self) -> Path:
        run_id = await self.submit(self.write_config(INFER, "infer-cpu", INFER_SETTINGS))
        ending = await self.follow(run_id, "infer", trials=True)
        if not isinstance(ending.data, RunSucceeded):
            raise DemoError(f"the infer run {run_id} ended with {ending.name}. Fix: see `runctl show {run_id}`.")
        summary = ending.data.summary
        if not summary.get("kept"):
            raise DemoError(
                f"the infer run's difficulty filter kept no task (its pass rates: `runctl show {run_id}`), so there "
                "is nothing to train on. Fix: remake the tiny model (`python -m runctl.tinymodel .cache/tinymodel`), "
                "or widen INFER_SETTINGS in runctl/cli/cpudemo.py."
            )
        return Path(summary["filtered_index"])

    async def train(self, index: Path) -> str:
        config = self.write_config(TRAIN, "train-cpu", {"TRAIN_FILES": str(index), "EVAL_DATASET": str(index)})
        return await self.submit(config)

    async def heldout(self, model: str, name: str, like: TrainConfig) -> Score:
        """An eval run of ``model`` on the held-out tasks at the checkpoints' temperature, with half their trials per
        task (there are three tasks)."""
        values = {
            "MODEL_PATH": model,
            "DATASET_PATH": str(HELDOUT),
            "N_TRIALS": str(max(1, like.eval_n_trials // 2)),
            "EVAL_TEMPERATURE": str(like.eval_temperature),
            "EXP_NAME": name,
        }
        run_id = await self.submit(self.write_config(EVAL, name, values))
        return score_of(run_id, await self.follow(run_id, name, trials=False))

    async def run(self) -> int:
        train_config = load_config(TRAIN).model
        assert isinstance(train_config, TrainConfig)
        index = await self.infer()
        train_run = await self.train(index)
        # The base model's held-out score does not wait for the training.
        held_base = asyncio.ensure_future(self.heldout(str(train_config.model_path), "heldout-base", train_config))
        seen: list[Event] = []
        ending = await self.follow(train_run, "train", trials=False, seen=seen)
        if ending.name != "run.succeeded":
            raise DemoError(f"the train run {train_run} ended with {ending.name}. Fix: see `runctl show {train_run}`.")
        saved = {e.data.step: e.data.path for e in seen if isinstance(e.data, CheckpointSaved)}
        if not saved:
            raise DemoError(f"the train run {train_run} saved no checkpoint. Fix: see `runctl show {train_run}`.")
        last = max(saved)
        held_last = asyncio.ensure_future(self.heldout(saved[last], f"heldout-step{last}", train_config))

        # The launcher submits each checkpoint's eval run (and the base model's, as step 0) under a known id; those
        # still queued behind RUNCTL_MAX_EVALS_IN_FLIGHT are followed from their first event.
        from services.launcher.library import eval_run_id

        async def scored(step: int) -> tuple[int, Score]:
            run_id = eval_run_id(train_run, step)
            label = f"eval step {step}" if step else "eval base model"
            return step, score_of(run_id, await self.follow(run_id, label, trials=False))

        on_checkpoints = dict(await asyncio.gather(*(scored(step) for step in [0, *sorted(saved)])))
        self.report(train_run, on_checkpoints, await held_base, await held_last, last)
        return 0

    def report(self, train_run: str, scores: dict[int, Score], held_base: Score, held_last: Score, last: int) -> None:
        from runctl.sdk import dashboard_url

        base = scores.get(0)
        self.console.print(f"\n[bold]train run {train_run}[/]: pass@1 on its training tasks, every checkpoint")
        for step, score in sorted(scores.items()):
            label = "base model" if step == 0 else f"step {step}"
            beside = (
                ""
                if base is None or step == 0
                else f"   (base {base.pass_at_1:.2f}, {score.pass_at_1 - base.pass_at_1:+.2f})"
            )
            self.console.print(f"  {label:<11} pass@1 {score.text()}{beside}   eval run {score.run_id}")
        self.console.print("held-out tasks (examples/tasks-heldout):")
        self.console.print(f"  base model  pass@1 {held_base.text()}   eval run {held_base.run_id}")
        self.console.print(f"  step {last:<6} pass@1 {held_last.text()}   eval run {held_last.run_id}")
        self.console.print("every run, the training curves and the checkpoints' scores are in the dashboard:")
        self.console.print(dashboard_url())
