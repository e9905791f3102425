"""The trainer's pure parts: the config mapped onto TRL's GRPOConfig, captured sequences turned into samples, the
checkpoint layout and retention, and the eval run a checkpoint gets."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from runctl.config import TrainConfig, load_config, resolve_text
from runctl.config.loader import validate_settings
from runctl.events import ConfigSubmitted
from services.launcher.evals import eval_config_text
from services.launcher.evalstore import eval_run_id
from services.launcher.trainer import checkpoints
from services.launcher.trainer.samples import Filters, balance_filtered, sample_of
from services.launcher.trainer.settings import clip_range, grpo_kwargs, plan, task_order


def train_config(**values: Any) -> TrainConfig:
    base = {
        "RUN_TYPE": "train",
        "ENGINE": "local",
        "PROJECT_NAME": "p",
        "EXP_NAME": "e",
        "MODEL_PATH": "/models/tiny",
        "TRAIN_FILES": "/data/train.parquet",
        "NGPUS_PER_NODE": "0",
        "GEN_TP": "1",
    }
    config = validate_settings("train", {**base, **{k: str(v) for k, v in values.items()}}, "test")
    assert isinstance(config, TrainConfig)
    return config


def test_one_optimizer_step_per_step_on_all_its_trials() -> None:
    kwargs = grpo_kwargs(train_config(TRAIN_BSZ=3, N_RESP=4, ACTOR_LR=1e-4), "/out", 8)
    assert kwargs["per_device_train_batch_size"] == 12 and kwargs["num_generations"] == 4
    assert kwargs["steps_per_generation"] == 1 and kwargs["gradient_accumulation_steps"] == 1
    assert kwargs["learning_rate"] == 1e-4 and kwargs["use_cpu"] is True and kwargs["save_steps"] == 1


def test_micro_batches_accumulate_into_the_one_step_from_one_rollout() -> None:
    kwargs = grpo_kwargs(train_config(TRAIN_BSZ=3, N_RESP=4, TRAIN_MICRO_BSZ_PER_GPU=2), "/out", 8)
    assert kwargs["per_device_train_batch_size"] == 2 and kwargs["num_generations"] == 4
    assert kwargs["gradient_accumulation_steps"] == kwargs["steps_per_generation"] == 6


@pytest.mark.parametrize(
    ("values", "level", "clip", "beta"),
    [
        ({"POLICY_LOSS_MODE": "vanilla"}, "token", (0.2, 0.28), 0.001),
        ({"POLICY_LOSS_MODE": "gspo"}, "sequence", (3e-4, 4e-4), 0.001),
        ({"POLICY_LOSS_MODE": "vanilla", "CLIP_RATIO_LOW": 0.1, "CLIP_RATIO_HIGH": 0.3}, "token", (0.1, 0.3), 0.001),
        ({"USE_KL_LOSS": 0, "KL_LOSS_COEF": 0.5}, "sequence", (3e-4, 4e-4), 0.0),
        ({"USE_KL_LOSS": 1, "KL_LOSS_COEF": 0.5}, "sequence", (3e-4, 4e-4), 0.5),
    ],
)
def test_loss_mode_clip_range_and_kl(
    values: dict[str, Any], level: str, clip: tuple[float, float], beta: float
) -> None:
    config = train_config(**values)
    kwargs = grpo_kwargs(config, "/out", 8)
    assert kwargs["importance_sampling_level"] == level
    assert clip_range(config) == clip == (kwargs["epsilon"], kwargs["epsilon_high"])
    assert kwargs["beta"] == beta


@pytest.mark.parametrize(
    ("name", "trl"), [("constant", "constant_with_warmup"), ("cosine", "cosine"), ("linear", "linear")]
)
def test_schedules(name: str, trl: str) -> None:
    kwargs = grpo_kwargs(train_config(LR_SCHEDULER=name, LR_WARMUP_STEPS=3, TOTAL_TRAINING_STEPS=9), "/out", 8)
    assert kwargs["lr_scheduler_type"] == trl and kwargs["warmup_steps"] == 3


def test_the_plan_counts_whole_batches_per_epoch_unless_the_steps_are_given() -> None:
    assert plan(train_config(TRAIN_BSZ=4, TOTAL_EPOCHS=2), 10).total_steps == 4  # 2 whole batches × 2 epochs
    assert plan(train_config(TRAIN_BSZ=4, TOTAL_TRAINING_STEPS=7), 10).total_steps == 7


FILTERS = Filters(timeout=True, env_setup_failed=True, overlong=True, max_prompt=100, max_resp=50, error=True)


def seq(prompt: list[int], response: list[int], mask: list[int]) -> dict[str, Any]:
    return {
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "response_mask": mask,
        "response_logprobs": [-0.5 if m else 0.0 for m in mask],
    }


def record(reward: float | None = 1.0, reason: str = "agent_completed", trial: int = 0) -> dict[str, Any]:
    return {"task": "t", "trial": trial, "reward": reward, "termination_reason": reason}


def test_a_sample_takes_the_sequence_with_the_most_model_tokens_and_counts_the_others() -> None:
    trajectory = {"sequences": [seq([1, 2], [3, 4, 5], [1, 0, 1]), seq([1], [6], [1])]}
    s = sample_of(record(), trajectory, FILTERS, pad_id=0)
    assert (s.prompt_ids, s.completion_ids, s.mask, s.logprobs) == ([1, 2], [3, 4, 5], [1, 0, 1], [-0.5, 0.0, -0.5])
    assert s.extra_sequences == 1 and s.model_tokens == 2 and s.score == s.reward == 1.0 and s.filtered is None


@pytest.mark.parametrize(
    ("reason", "prompt_len", "response_len", "why"),
    [
        ("timeout", 2, 3, "timeout"),
        ("env_setup_failed", 2, 3, "env_setup_failed"),
        ("overlong", 2, 3, "overlong"),
        ("agent_completed", 101, 3, "overlong"),
        ("agent_completed", 2, 51, "overlong"),
        ("max_turns", 2, 3, None),
        ("error", 2, 3, "error"),
    ],
)
def test_filtered_trajectories_are_masked_out_and_bounded(
    reason: str, prompt_len: int, response_len: int, why: str | None
) -> None:
    trajectory = {"sequences": [seq([7] * prompt_len, [8] * response_len, [1] * response_len)]}
    s = sample_of(record(reason=reason), trajectory, FILTERS, pad_id=0)
    assert s.filtered == why
    assert len(s.prompt_ids) <= 100 and len(s.completion_ids) <= 50
    assert (sum(s.mask) == 0) == (why is not None)


@pytest.mark.parametrize("reason", ["timeout", "error"])
def test_a_filter_turned_off_keeps_the_trajectory(reason: str) -> None:
    off = Filters(timeout=False, env_setup_failed=True, overlong=True, max_prompt=100, max_resp=50, error=False)
    s = sample_of(record(reason=reason), {"sequences": [seq([1], [2], [1])]}, off, pad_id=0)
    assert s.filtered is None and s.mask == [1]


def test_an_error_ending_is_trained_unless_the_run_asks_otherwise() -> None:
    """mini-swe-agent's trials that wrote the answer and then broke its format end ``error`` with reward 1; by
    default they are trained (as the reference system does), and TRAJ_FILTER_ERROR=1 keeps them out."""
    from services.launcher.trainer.loop import filters_of

    assert not filters_of(train_config()).error and filters_of(train_config(TRAJ_FILTER_ERROR=1)).error


def test_a_trial_without_a_model_call_is_a_masked_placeholder_with_its_score() -> None:
    s = sample_of(record(reward=None, reason="env_setup_failed"), None, FILTERS, pad_id=9)
    assert (s.prompt_ids, s.completion_ids, s.mask) == ([9], [9], [0]) and s.filtered == "env_setup_failed"
    assert s.score == 0.0


def test_filtered_samples_take_their_groups_mean_so_no_other_advantage_moves() -> None:
    trajectory = {"sequences": [seq([1], [2], [1])]}
    group = [
        sample_of(record(1.0), trajectory, FILTERS, 0),
        sample_of(record(0.0), trajectory, FILTERS, 0),
        sample_of(record(1.0, "timeout"), trajectory, FILTERS, 0),
        sample_of(record(0.0), trajectory, FILTERS, 0),
        sample_of(record(0.0, "timeout"), trajectory, FILTERS, 0),
        sample_of(record(1.0, "timeout"), trajectory, FILTERS, 0),
    ]
    balance_filtered(group, 3)
    assert [s.reward for s in group] == [1.0, 0.0, 0.5, 0.0, 0.0, 0.0]
    assert [s.score for s in group] == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]


def resume_point(run_dir: Path, step: int, complete: bool = True) -> Path:
    point = checkpoints.state_dir(run_dir) / f"checkpoint-{step}"
    point.mkdir(parents=True)
    for name, size in [("model.safetensors", 1000), ("config.json", 10), ("tokenizer.json", 20),
                       ("chat_template.jinja", 5), ("optimizer.pt", 2000), ("rng_state.pth", 7)]:  # fmt: skip
        (point / name).write_bytes(b"x" * size)
    if complete:
        (point / "trainer_state.json").write_text("{}")
    return point


def test_a_published_checkpoint_is_a_hugging_face_folder_beside_its_resume_point_sharing_the_weights(
    tmp_path: Path,
) -> None:
    point = resume_point(tmp_path, 4)
    hf, num_bytes = checkpoints.publish(tmp_path, point, 4)
    assert hf == tmp_path / "checkpoints" / "global_step_4" / "huggingface"
    assert sorted(p.name for p in hf.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    trainer = hf.parent / "trainer"
    assert {p.name for p in trainer.iterdir()} == {p.name for p in point.iterdir()}
    assert os.stat(hf / "model.safetensors").st_ino == os.stat(point / "model.safetensors").st_ino
    assert num_bytes == 1000 + 10 + 20 + 5 + 2000 + 7 + 2  # each file once, however many links
    assert checkpoints.publish(tmp_path, point, 4) == (hf, num_bytes)  # again: nothing changes


def test_an_incomplete_resume_point_is_not_one(tmp_path: Path) -> None:
    resume_point(tmp_path, 1)
    resume_point(tmp_path, 2, complete=False)
    assert sorted(checkpoints.resume_points(tmp_path)) == [1]


def test_max_ckpt_to_keep_never_deletes_a_checkpoint_whose_eval_is_running(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        checkpoints.publish(tmp_path, resume_point(tmp_path, step), step)
    assert checkpoints.prune(tmp_path, None, set()) == []
    assert checkpoints.prune(tmp_path, 2, pinned={2}) == [4]
    assert checkpoints.published_steps(tmp_path) == [2, 6, 8]
    assert checkpoints.prune(tmp_path, 2, pinned=set()) == [2]
    assert checkpoints.published_steps(tmp_path) == [6, 8]


def test_max_ckpt_to_keep_prunes_verls_checkpoints_in_verls_layout(tmp_path: Path) -> None:
    # The same pruning for ENGINE=verl's runs (by the runner, and by the launcher once an eval ends), whose
    # checkpoints keep their Hugging Face folder at global_step_N/actor/huggingface.
    hf = checkpoints.hf_of(train_config(ENGINE="verl"))
    assert hf == checkpoints.VERL_HF and checkpoints.hf_of(train_config()) == checkpoints.HF
    for step in (1, 2, 3):
        (checkpoints.published_folder(tmp_path, step) / hf).mkdir(parents=True)
    assert checkpoints.published_steps(tmp_path) == []  # not the local trainer's layout
    assert checkpoints.prune(tmp_path, 1, {1}, hf) == [2]
    assert checkpoints.published_steps(tmp_path, hf) == [1, 3]


def test_the_eval_run_of_a_checkpoint_keeps_the_train_runs_agent_and_scores_the_checkpoint(tmp_path: Path) -> None:
    config = train_config(
        EVAL_ON_CHECKPOINT=1,
        EVAL_DATASET="/data/held-out",
        EVAL_N_TRIALS=8,
        SCAFFOLD="terminal",
        AGENT_MAX_ITERATIONS=7,
        TRAIN_BSZ=2,
        WANDB_API_KEY="secret-value-123",
        AGENT_COMMAND='run "it" $ `now`',
    )
    resolved = {
        k.upper(): {"value": str(v) if v is not None else None, "layer": "run", "source": "x"}
        for k, v in config.model_dump(by_alias=True).items()
        if k.lower() in config.model_fields_set
    }
    resolved["WANDB_API_KEY"]["value"] = "***"
    parent = ConfigSubmitted(
        run_type="train", project_name="p", exp_name="e", engine="local", config_path="x", raw_config="",
        resolved=resolved, submitter="me",
    )  # fmt: skip
    text = eval_config_text(parent, "e-20261201-00", config, 4, "/runs/e/checkpoints/global_step_4/huggingface")
    path = tmp_path / "eval.env"
    path.write_text(text)
    evaluated = load_config(path, environ={}).model
    assert evaluated.run_type == "eval"
    assert evaluated.model_path == "/runs/e/checkpoints/global_step_4/huggingface"
    assert evaluated.dataset_path == "/data/held-out" and evaluated.n_trials == 8
    assert evaluated.parent_run == "e-20261201-00" and evaluated.checkpoint_step == 4
    assert evaluated.agent_max_iterations == 7 and evaluated.agent_command == 'run "it" $ `now`'
    assert evaluated.wandb_api_key is None and "TRAIN_BSZ" not in text
    assert eval_run_id("e-20261201-00", 4) == "e-20261201-00-eval-s4"


def test_the_task_order_is_fixed_for_the_whole_run_and_reshuffled_each_epoch() -> None:
    tasks = [f"t{i}" for i in range(5)]
    config = train_config(TRAIN_BSZ=2, TOTAL_EPOCHS=3)
    order = task_order(config, tasks)
    assert order == task_order(config, tasks)  # the same on every resume
    assert len(order) == 3 * 2 * 2  # 2 whole batches per epoch (the fifth task waits), 3 epochs
    epochs = [order[i : i + 4] for i in range(0, 12, 4)]
    assert all(len(set(e)) == 4 for e in epochs) and len({tuple(e) for e in epochs}) > 1
    assert len(task_order(train_config(TRAIN_BSZ=2, TOTAL_TRAINING_STEPS=5), tasks)) == 10


def test_a_verl_run_s_checkpoints_are_evaluated_by_the_local_engine_on_the_same_gpus() -> None:
    config = train_config(ENGINE="verl", NGPUS_PER_NODE=1, GEN_TP=1, GPU_MEM_UTIL=0.3, EVAL_ON_CHECKPOINT=1,
                          EVAL_DATASET="/data/held-out", VENV_PATH="/opt/gpu")  # fmt: skip
    resolved = {
        k.upper(): {"value": str(v), "layer": "run", "source": "x"}
        for k, v in config.model_dump(by_alias=True).items()
        if k.lower() in config.model_fields_set
    }
    parent = ConfigSubmitted(
        run_type="train", project_name="p", exp_name="e", engine="verl", config_path="x", raw_config="",
        resolved=resolved, submitter="me",
    )  # fmt: skip
    text = eval_config_text(parent, "e-1", config, 2, "/runs/e/checkpoints/global_step_2/actor/huggingface")
    evaluated = resolve_text(text, "eval.env", environ={}).model
    assert evaluated.engine == "local" and text.count("ENGINE=") == 1
    assert (evaluated.ngpus_per_node, evaluated.gpu_mem_util, evaluated.venv_path) == (1, 0.3, "/opt/gpu")
