"""The GPU smoke check (``./scripts/gpu_smoke.sh``, ``runctl demo --gpu``): a verl train run through the stack.

Two GRPO steps of ``configs/examples/train-gpu.env`` (ENGINE=verl, one GPU, the tiny model, the example tasks) with a
checkpoint after each, the launcher's eval run on every checkpoint (and the base model, as step 0) on the held-out
tasks. It prints every event of the train run as it comes, then the count of each kind, the time of each step (verl's
own ``timing_s/step`` and the time between ``step.done`` events) and each eval run's pass@1.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from runctl.cli.cpudemo import Demo, DemoError, Score, score_of
from runctl.events import Event
from runctl.events.payloads import CheckpointSaved, PhaseStarted, StepDone

TRAIN_GPU = Path("configs/examples/train-gpu.env")


class GpuSmoke(Demo):
    async def run(self) -> int:
        from services.launcher.library import eval_run_id

        values = {"MODEL_PATH": str(Path(".cache/tinymodel").resolve()), "VENV_PATH": str(Path(".venv-gpu").resolve())}
        started = time.monotonic()
        train_run = await self.submit(self.write_config(TRAIN_GPU, "train-gpu", values))
        seen: list[Event] = []
        ending = await self.follow(train_run, "train", trials=True, seen=seen)
        if ending.name != "run.succeeded":
            raise DemoError(f"the train run {train_run} ended with {ending.name}. Fix: see `runctl show {train_run}`.")
        saved = sorted({e.data.step for e in seen if isinstance(e.data, CheckpointSaved)})
        scores: dict[int, Score] = {}
        for step in [0, *saved]:
            run_id = eval_run_id(train_run, step)
            label = f"eval step {step}" if step else "eval base model"
            scores[step] = score_of(run_id, await self.follow(run_id, label, trials=False))
        self.summary(train_run, seen, started, scores)
        return 0

    def summary(self, train_run: str, seen: list[Event], started: float, scores: dict[int, Score]) -> None:
        counts = Counter(e.name for e in seen)
        self.console.print(f"\n[bold]train run {train_run}[/] (ENGINE=verl): the events it published")
        for name, count in counts.items():
            self.console.print(f"  {name:<18} {count}")
        self.console.print("step times (verl's timing_s/step; and between the events, as published):")
        loop = [e.time for e in seen if isinstance(e.data, PhaseStarted) and e.data.phase == "loop"]
        previous = loop[-1] if loop else None
        for event in seen:
            if isinstance(event.data, StepDone):
                verl_s = event.data.metrics.get("timing_s/step")
                shown = "—" if verl_s is None else f"{verl_s:.1f} s"
                since = "" if previous is None else f"; {(event.time - previous).total_seconds():.1f} s since the last"
                self.console.print(f"  step {event.data.step}: {shown}{since}")
                previous = event.time
        self.console.print("eval runs (pass@1 on examples/tasks-heldout):")
        for step, score in sorted(scores.items()):
            label = "base model" if step == 0 else f"step {step}"
            self.console.print(f"  {label:<11} {score.text()}   eval run {score.run_id}")
        self.console.print(f"all in {time.monotonic() - started:.0f} s")
