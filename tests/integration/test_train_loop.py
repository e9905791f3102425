"""The train loop with TRL for real on the tiny model, its rollouts from a stand-in trial loop (no vLLM, no
sandboxes): steps, checkpoints and their retention, the step records, and a resume that neither loses nor changes
a published step."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from runctl.config import TrainConfig
from runctl.config.loader import validate_settings
from runctl.events import CheckpointSaved, StepDone, TrialFinished
from runctl.events.payloads import Payload
from runctl.layout import TRAJECTORY, trial_folder
from runctl.tasks import Task
from services.launcher.engines.base import RunContext
from services.launcher.rollout.trials import trial_event
from services.launcher.trainer import checkpoints
from services.launcher.trainer.loop import STEP_RECORD, TrainLoop
from services.launcher.weights.fake import FakeSync
from tests.infra import vllm_server as vllm_infra

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("trl") is None, reason="TRL is not installed (scripts/setup.sh)"
    ),
]


class RunnerDied(Exception):
    """Stands for the runner's process dying at that point."""


class StandInTrials:
    """What a step's TrialLoop gives the train loop: trial folders with a record and a captured sequence."""

    def __init__(
        self, tasks: list[Task], first: int, trials_dir: Path, n: int, ctx: RunContext, tails: bool = False
    ) -> None:
        self.tasks, self.first, self.trials_dir, self.n, self.ctx = tasks, first, trials_dir, n, ctx
        self.tails = tails  # answers of 2 to 4 tokens, so that each micro-batch holds its own count of tokens
        self.records: list[dict[str, Any]] = []

    async def recover(self) -> list[tuple[Task, int]]:
        todo = []
        for task in self.tasks:
            for k in range(self.first, self.first + self.n):
                path = trial_folder(self.trials_dir, task.id, k) / "trial.json"
                if path.is_file():
                    self.records.append(json.loads(path.read_text()))
                else:
                    todo.append((task, k))
        return todo

    async def run(self, todo: list[tuple[Task, int]], cancelled: asyncio.Event) -> None:
        for task, k in todo:
            folder = trial_folder(self.trials_dir, task.id, k)
            folder.mkdir(parents=True, exist_ok=True)
            answer = [11 + k % 3, 12] + [14] * ((k + int(task.id[1:])) % 3 if self.tails else 0)
            sequence = {"prompt_token_ids": [1, 2, 3], "response_token_ids": answer,
                        "response_mask": [1] * len(answer), "response_logprobs": [-0.7] * len(answer)}  # fmt: skip
            (folder / TRAJECTORY).write_text(json.dumps({"sequences": [sequence]}))
            record = {"task": task.id, "trial": k, "reward": float(k % 3 == 0), "termination_reason": "agent_completed",
                      "durations_s": {"wall": 0.1}, "tokens": {}}  # fmt: skip
            (folder / "trial.json").write_text(json.dumps(record))
            await self.ctx.emit(trial_event(record), f"trial.{task.id}.{k}")
            self.records.append(record)


def config(tmp_path: Path, **values: Any) -> TrainConfig:
    base = {"RUN_TYPE": "train", "ENGINE": "local", "PROJECT_NAME": "p", "EXP_NAME": "loop",
            "MODEL_PATH": str(vllm_infra.tiny_model()), "TRAIN_FILES": str(tmp_path), "NGPUS_PER_NODE": "0",
            "GEN_TP": "1", "TRAIN_BSZ": "2", "N_RESP": "3", "TOTAL_TRAINING_STEPS": "4", "SAVE_FREQ": "2",
            "ACTOR_LR": "0.001", "POLICY_LOSS_MODE": "vanilla"}  # fmt: skip
    made = validate_settings("train", {**base, **{k: str(v) for k, v in values.items()}}, "test")
    assert isinstance(made, TrainConfig)
    return made


def run_loop(
    cfg: TrainConfig, run_dir: Path, published: list[tuple[str, Payload]], stop_after: int = 0, tails: bool = False
) -> Any:
    tasks = [Task(run_dir, None, f"t{i}") for i in range(3)]  # type: ignore[arg-type]
    progress: dict[str, Any] = {}

    async def emit(payload: Payload, key: str) -> None:
        published.append((key, payload))
        if stop_after and isinstance(payload, StepDone) and payload.step >= stop_after:
            raise RunnerDied  # the runner dies right after publishing this step

    async def save(state: dict[str, Any]) -> None:
        progress.update(state)

    async def nothing_pinned() -> set[int]:
        return set()

    ctx = RunContext("loop-run", "demo", cfg, run_dir, emit, save)
    sync = FakeSync()

    def trials(step_tasks: list[Task], first: int) -> Any:
        return StandInTrials(step_tasks, first, run_dir / "trials", cfg.n_resp, ctx, tails)

    loop = TrainLoop(ctx, cfg, tasks, trials, sync, nothing_pinned, pad_id=0)
    return asyncio.run(loop.run()), sync


@pytest.mark.timeout(600)
def test_steps_checkpoints_and_a_resume_that_changes_no_published_step(tmp_path: Path) -> None:
    cfg = config(tmp_path, MAX_CKPT_TO_KEEP=1)
    run_dir = tmp_path / "run"
    first: list[tuple[str, Payload]] = []
    with pytest.raises(RunnerDied):
        run_loop(cfg, run_dir, first, stop_after=3)
    steps_before = {p.step: p.metrics for _, p in first if isinstance(p, StepDone)}
    assert sorted(steps_before) == [1, 2, 3]
    # It died before dropping step 2's resume point: both are complete, and the newest is resumed from.
    assert sorted(checkpoints.resume_points(run_dir)) == [2, 3]

    again: list[tuple[str, Payload]] = []
    last, sync = run_loop(cfg, run_dir, again)
    steps_after = {p.step: p.metrics for _, p in again if isinstance(p, StepDone)}
    assert sorted(steps_after) == [3, 4]  # step 3 announced again (the same id and values), then the last step
    assert steps_after[3] == steps_before[3]
    assert [s for s, _ in sync.synced] == [3, 4]  # the replicas are first brought to the resume point
    assert last["step"] == 4 and last["final"] is True
    saved = [p for _, p in first + again if isinstance(p, CheckpointSaved)]
    assert sorted({p.step for p in saved}) == [2, 4]
    assert checkpoints.published_steps(run_dir) == [4]  # MAX_CKPT_TO_KEEP=1
    assert sorted(checkpoints.resume_points(run_dir)) == [4]  # only the newest resume point is kept
    # 4 steps × 2 tasks × 3 trials, each with its own number: step s numbers its trials from (s − 1) × 3.
    trials = {(t.task, t.trial) for _, t in first + again if isinstance(t, TrialFinished)}
    assert len(trials) == 24 and sorted({k for _, k in trials}) == list(range(12))
    for step in (1, 2, 3, 4):
        metrics = (steps_before | steps_after)[step]
        assert metrics["actor/grad_norm"] >= 0 and "timing_s/update_actor" in metrics
        assert metrics["critic/score/mean"] == pytest.approx(sum(1 for k in range(3) if k % 3 == 0) / 3)


@pytest.mark.timeout(600)
def test_an_incomplete_resume_point_is_dropped_and_its_step_made_again(tmp_path: Path) -> None:
    cfg = config(tmp_path, TOTAL_TRAINING_STEPS=2, SAVE_FREQ=-1)
    run_dir = tmp_path / "run"
    published: list[tuple[str, Payload]] = []
    with pytest.raises(RunnerDied):
        run_loop(cfg, run_dir, published, stop_after=1)
    point = checkpoints.latest_resume_point(run_dir)
    assert point is not None
    # As if the runner had died after TRL wrote step 2's resume point but before runctl recorded it.
    fake = point.with_name("checkpoint-2")
    shutil.copytree(point, fake)
    (fake / STEP_RECORD).unlink()
    last, _ = run_loop(cfg, run_dir, published)
    assert last["step"] == 2
    assert [p.step for _, p in published if isinstance(p, CheckpointSaved)] == [2]  # SAVE_FREQ=-1: only the end


@pytest.mark.timeout(600)
def test_the_update_moves_the_policy_towards_the_rewarded_answer(tmp_path: Path) -> None:
    # The stand-in trials answer 11, 12 or 13 after the prompt [1, 2, 3], and only 11 is rewarded: after a few
    # updates the policy must prefer 11 to the other two answers by more than the base model did (the advantage's
    # sign, the samples' order and the rewards' alignment all matter here). The margin, not 11's own logprob: Adam
    # also moves probability to tokens no trial sampled.
    import torch
    from transformers import AutoModelForCausalLM

    cfg = config(tmp_path, TOTAL_TRAINING_STEPS=4, SAVE_FREQ=4, USE_KL_LOSS=0)
    run_dir = tmp_path / "run"
    run_loop(cfg, run_dir, [])

    def margin(folder: Path) -> float:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            logp = model(torch.tensor([[1, 2, 3]])).logits[0, -1].log_softmax(-1)
        return float(logp[11] - torch.maximum(logp[12], logp[13]))

    trained = checkpoints.published_folder(run_dir, 4) / checkpoints.HF
    assert margin(trained) > margin(vllm_infra.tiny_model()) + 0.5


@pytest.mark.timeout(600)
def test_micro_batches_make_the_update_the_whole_batch_makes(tmp_path: Path) -> None:
    """TRAIN_MICRO_BSZ_PER_GPU=2 splits a step's 6 samples (answers of 2 to 4 tokens, so each pass holds its own
    count of tokens) into 3 passes whose gradients add up to the one optimizer step: the gradient's norm and the
    weights it leads to are those of the whole batch in one pass, KL term included. One optimizer step per
    micro-batch, or a loss normalised over each pass's own tokens, would each move them."""
    import torch
    from safetensors.torch import load_file

    moved: dict[str, tuple[float, dict[str, torch.Tensor]]] = {}
    for name, extra in (("whole", {}), ("micro", {"TRAIN_MICRO_BSZ_PER_GPU": 2})):
        published: list[tuple[str, Payload]] = []
        run_loop(config(tmp_path, TOTAL_TRAINING_STEPS=1, SAVE_FREQ=1, **extra), tmp_path / name, published, tails=True)
        (done,) = [p for _, p in published if isinstance(p, StepDone)]
        weights = load_file(checkpoints.published_folder(tmp_path / name, 1) / checkpoints.HF / "model.safetensors")
        moved[name] = (done.metrics["actor/grad_norm"], weights)
    base = load_file(vllm_infra.tiny_model() / "model.safetensors")
    (whole_norm, whole), (micro_norm, micro) = moved["whole"], moved["micro"]
    assert micro_norm == pytest.approx(whole_norm, rel=1e-4), (micro_norm, whole_norm)
    step = torch.cat([(whole[k] - base[k]).flatten() for k in base])
    apart = torch.cat([(micro[k] - whole[k]).flatten() for k in base])
    assert float(step.norm()) > 0 and float(apart.norm()) < 0.01 * float(step.norm()), (apart.norm(), step.norm())
