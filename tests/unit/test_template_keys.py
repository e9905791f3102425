"""Honest validation: every key a template offers is either read by the code that carries the run (or by the
validator, for the keys that are inputs to its checks), or refused by the validator, with a message that says what
is not built. Nothing a template offers is silently ignored."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from runctl.config import resolve_text
from runctl.events import CheckResult
from services.validator.library import check_config
from tests.conftest import ROOT

TEMPLATES = ROOT / "configs" / "templates"
DATA = ROOT / "tests" / "data"

#: Key → the modules that read it (as ``<something>.<field>``), for keys honoured for ENGINE=local infer and eval.
HONOURED: dict[str, tuple[str, ...]] = {
    "GPU_MEM_UTIL": ("services/launcher/rollout/replicas.py",),  # on a GPU; refused on CPU
    "RUN_TYPE": ("runctl/config/loader.py",),
    "TEAM": ("services/launcher/carry/foreground.py", "services/launcher/service.py"),
    "PRIORITY": ("services/launcher/service.py",),  # orders a team's queued runs
    "ENGINE": ("services/launcher/carry/lifecycle.py",),
    "PROJECT_NAME": ("runctl/sdk.py", "services/validator/checks/live_probes.py"),
    "EXP_NAME": ("runctl/sdk.py", "runctl/cli/progress.py"),
    "MODEL_PATH": ("services/launcher/rollout/replicas.py",),
    "SERVED_MODEL_NAME": ("services/launcher/rollout/replicas.py", "services/launcher/engines/local.py"),
    "TOOL_CALL_PARSER": ("services/launcher/rollout/replicas.py",),
    "MAX_MODEL_LEN": ("services/launcher/rollout/replicas.py",),
    "RAY_ADDRESS": ("services/launcher/engines/local.py",),
    "NNODES": ("services/launcher/engines/local.py",),
    "NGPUS_PER_NODE": ("services/launcher/rollout/replicas.py",),
    "GPU_MEMORY_GB": ("services/validator/checks/model_fit.py",),
    "GEN_TP": ("services/launcher/rollout/replicas.py",),
    "GEN_DP": ("services/launcher/rollout/replicas.py",),
    "SCAFFOLD": ("services/launcher/engines/local.py",),
    "AGENT_NAME": ("services/launcher/engines/local.py",),
    "AGENT_COMMAND": ("services/launcher/engines/local.py",),
    "AGENT_VERSION": ("services/launcher/engines/local.py", "services/validator/checks/config_paths.py"),
    "BACKEND": ("services/launcher/engines/local.py",),
    "AGENT_MAX_ITERATIONS": ("services/launcher/engines/local.py",),
    "AGENT_TIMEOUT_SEC": ("services/launcher/engines/local.py",),
    "SANDBOX_RETRIES": ("services/launcher/engines/local.py",),
    "SANDBOX_CPUS": ("services/launcher/engines/local.py",),
    "SANDBOX_MEMORY_MB": ("services/launcher/engines/local.py",),
    "AGENT_NETWORK": ("services/launcher/engines/local.py",),
    "VERIFIER_NETWORK": ("services/launcher/engines/local.py", "services/validator/checks/runtime_services.py"),
    "IMAGE_REGISTRY": ("services/sandbox/library.py",),
    "IMAGE_BUILD": ("services/validator/checks/runtime_services.py",),  # which image source: checked, not guessed
    "DOCKER_HOST": ("services/sandbox/library.py", "services/validator/checks/sandbox_probes.py"),
    "KUBECONFIG": ("services/sandbox/library.py", "services/validator/checks/sandbox_probes.py"),
    "K8S_NAMESPACE": ("services/sandbox/library.py", "services/validator/checks/sandbox_probes.py"),
    "POD_STARTUP_TIMEOUT_SEC": ("services/sandbox/library.py",),
    "POD_ACTIVE_DEADLINE_SEC": ("services/sandbox/library.py",),
    "K8S_BUNDLE_CLAIM": ("services/sandbox/library.py", "services/validator/checks/sandbox_probes.py"),
    "OUTPUT_DIR": ("services/launcher/carry/lifecycle.py",),
    "VENV_PATH": ("services/launcher/rollout/replicas.py", "services/launcher/carry/as_job.py"),
    "LOGGER": ("services/validator/rules.py",),  # console only for ENGINE=local; anything else is refused below
    "WANDB_API_KEY": ("services/validator/checks/runtime_services.py",),  # read only with LOGGER=wandb
    "WANDB_MODE": ("services/validator/checks/runtime_services.py",),
    "MAX_RETRIES": ("services/launcher/carry/as_job.py",),
    "DATASET_PATH": ("services/launcher/engines/local.py",),
    "N_TASKS": ("services/launcher/engines/local.py",),
    "N_TRIALS": ("services/launcher/engines/local.py",),
    "EVAL_TEMPERATURE": ("services/launcher/engines/local.py",),
    "MAX_INPUT_TOKENS": ("services/launcher/engines/local.py",),
    "MAX_OUTPUT_TOKENS": ("services/launcher/engines/local.py",),
    "N_CONCURRENT": ("services/launcher/engines/local.py",),
    "VLLM_READY_TIMEOUT": ("services/launcher/engines/local.py",),
    "INDEX_FILE": ("services/launcher/engines/local.py",),
    "RESULTS_DIR": ("services/launcher/engines/local.py",),
    "OUTPUT_INDEX": ("services/launcher/engines/local.py",),
    "INSTANCES_FILE": ("services/launcher/engines/local.py",),
    "TEMPERATURE": ("services/launcher/engines/local.py",),
    "TRIAL_HARD_TIMEOUT_SEC": ("services/launcher/engines/local.py",),
    "FILTER_MIN_PASS_RATE": ("services/launcher/engines/local.py",),
    "FILTER_MAX_PASS_RATE": ("services/launcher/engines/local.py",),
}

#: Key → the modules that read it, for the keys of an ENGINE=local train run beyond those above.
HONOURED_TRAIN: dict[str, tuple[str, ...]] = {
    "TRAIN_FILES": ("services/launcher/engines/local.py",),
    "TRAIN_BSZ": ("services/launcher/trainer/settings.py",),
    "TRAIN_MICRO_BSZ_PER_GPU": ("services/launcher/trainer/settings.py",),
    "N_RESP": ("services/launcher/trainer/settings.py", "services/launcher/engines/local.py"),
    "MAX_PROMPT": ("services/launcher/trainer/loop.py",),
    "MAX_RESP": ("services/launcher/trainer/loop.py", "services/launcher/trainer/settings.py"),
    "TOTAL_EPOCHS": ("services/launcher/trainer/settings.py",),
    "TOTAL_TRAINING_STEPS": ("services/launcher/trainer/settings.py",),
    "SAVE_FREQ": ("services/launcher/trainer/loop.py",),
    "MAX_CKPT_TO_KEEP": ("services/launcher/trainer/loop.py", "services/launcher/evals.py"),
    "ADV_ESTIMATOR": ("services/validator/rules.py",),  # grpo, the one TRL has; others are refused below
    "POLICY_LOSS_MODE": ("services/launcher/trainer/settings.py",),
    "USE_KL_LOSS": ("services/launcher/trainer/settings.py",),
    "KL_LOSS_COEF": ("services/launcher/trainer/settings.py",),
    "ENTROPY_COEFF": ("services/launcher/trainer/settings.py",),
    "ACTOR_LR": ("services/launcher/trainer/settings.py",),
    "LR_SCHEDULER": ("services/launcher/trainer/settings.py",),
    "LR_WARMUP_STEPS": ("services/launcher/trainer/settings.py",),
    "CLIP_RATIO_LOW": ("services/launcher/trainer/settings.py",),
    "CLIP_RATIO_HIGH": ("services/launcher/trainer/settings.py",),
    "TEMPERATURE": ("services/launcher/engines/local.py", "services/launcher/trainer/settings.py"),
    "AGENT_NUM_WORKERS": ("services/launcher/engines/local.py",),
    "TRAJ_FILTER_TIMEOUT": ("services/launcher/trainer/loop.py",),
    "TRAJ_FILTER_ENV_SETUP_FAILED": ("services/launcher/trainer/loop.py",),
    "TRAJ_FILTER_OVERLONG": ("services/launcher/trainer/loop.py",),
    "TRAJ_FILTER_ERROR": ("services/launcher/trainer/loop.py",),
    "VLLM_READY_TIMEOUT": ("services/launcher/engines/local.py",),
    "EVAL_ON_CHECKPOINT": ("services/launcher/evals.py",),
    "EVAL_DATASET": ("services/launcher/evals.py",),
    "EVAL_N_TRIALS": ("services/launcher/evals.py",),
    "EVAL_TEMPERATURE": ("services/launcher/evals.py",),
}

#: Key → a value ENGINE=local's trainer refuses (with what the refusal says).
REFUSED_TRAIN: dict[str, tuple[str, str]] = {
    "TRAINING_MODE": ("async", "the fully async mode is verl's"),
    "MODEL_ENGINE": ("fsdp", "these keys shape verl's distributed trainer"),
    "VAL_FILES": ("${RUNCTL_TEST_DATA}/tasks", "validates through eval runs of its checkpoints"),
    "N_NODES_TRAIN": ("1", "these keys shape verl's distributed trainer"),
    "N_NODES_ROLLOUT": ("0", "these keys shape verl's distributed trainer"),
    "SP_SIZE": ("1", "these keys shape verl's distributed trainer"),
    "EP_SIZE": ("1", "these keys shape verl's distributed trainer"),
    "TRAIN_MINI_BSZ": ("32", "one update per step on the whole batch"),
    "USE_DYNAMIC_BSZ": ("1", "these keys shape verl's distributed trainer"),
    "TEST_FREQ": ("5", "validates through eval runs of its checkpoints"),
    "VAL_BEFORE_TRAIN": ("0", "validates through eval runs of its checkpoints"),
    "ADV_ESTIMATOR": ("rloo", "the only estimator it has"),
    "POLICY_LOSS_MODE": ("clip_cov", "the other losses are verl's"),
    "ROLLOUT_IS": ("token", "rollout importance-sampling correction"),
    "ENABLE_R3": ("1", "these keys shape verl's distributed trainer"),
    "VEOMNI_FUSED_KERNELS": ("0", "these keys shape verl's distributed trainer"),
    "VEOMNI_ACTIVATION_OFFLOAD": ("0", "these keys shape verl's distributed trainer"),
    "GPU_MEM_UTIL": ("0.5", "vLLM on CPU has no GPU memory to share"),
    "VAL_TEMPERATURE": ("0.5", "validates through eval runs of its checkpoints"),
    "VAL_AGENT_TIMEOUT_SEC": ("60", "validates through eval runs of its checkpoints"),
    "PARTIAL_ROLLOUT": ("1", "fully async mode"),
    "STALENESS": ("0.5", "fully async mode"),
    "REQUIRE_BATCHES": ("2", "fully async mode"),
    "TRIGGER_PARAMETER_SYNC_STEP": ("2", "fully async mode"),
    "TOTAL_ROLLOUT_STEPS": ("10", "fully async mode"),
    "NNODES": ("2", "the trainer and the weights it syncs stay on the runner's machine"),
}

_VERL = ("runctl/verl.py",)
_VERL_ENGINE = ("services/launcher/engines/verl/engine.py",)
#: Key → the modules that read it, for the keys of an ENGINE=verl train run beyond HONOURED: the overrides verl is
#: launched with (runctl/verl.py), the runner (engines/verl/), and the trial settings its agent loop shares with
#: ENGINE=local (engines/local.py's loop_settings, trainer/loop.py's filters).
HONOURED_VERL: dict[str, tuple[str, ...]] = {
    **{k: _VERL for k in (
        "TRAINING_MODE", "TRAIN_BSZ", "N_RESP", "MAX_PROMPT", "MAX_RESP", "TOTAL_EPOCHS", "TOTAL_TRAINING_STEPS",
        "SAVE_FREQ", "TEST_FREQ", "VAL_BEFORE_TRAIN", "ADV_ESTIMATOR", "POLICY_LOSS_MODE", "USE_KL_LOSS",
        "KL_LOSS_COEF", "ENTROPY_COEFF", "ACTOR_LR", "LR_SCHEDULER", "LR_WARMUP_STEPS", "CLIP_RATIO_LOW",
        "CLIP_RATIO_HIGH", "TRAIN_MINI_BSZ", "TRAIN_MICRO_BSZ_PER_GPU", "USE_DYNAMIC_BSZ", "SP_SIZE", "GEN_TP",
        "GPU_MEM_UTIL", "TEMPERATURE", "VAL_TEMPERATURE", "ENABLE_R3", "AGENT_NUM_WORKERS", "NNODES",
        "NGPUS_PER_NODE", "LOGGER", "TOOL_CALL_PARSER", "ROLLOUT_IS", "SERVED_MODEL_NAME", "MAX_MODEL_LEN",
        "WANDB_MODE", "STALENESS", "REQUIRE_BATCHES", "TRIGGER_PARAMETER_SYNC_STEP", "TOTAL_ROLLOUT_STEPS",
        "N_NODES_TRAIN", "N_NODES_ROLLOUT",
    )},
    "TRAIN_FILES": ("services/launcher/engines/local.py",),
    "VAL_FILES": _VERL_ENGINE,
    "MAX_CKPT_TO_KEEP": _VERL_ENGINE,
    "VENV_PATH": _VERL,
    "WANDB_API_KEY": _VERL_ENGINE,
    "RAY_ADDRESS": _VERL_ENGINE,
    "VAL_AGENT_TIMEOUT_SEC": ("services/launcher/engines/verl/host.py",),
    "TRAJ_FILTER_TIMEOUT": ("services/launcher/trainer/loop.py",),
    "TRAJ_FILTER_ENV_SETUP_FAILED": ("services/launcher/trainer/loop.py",),
    "TRAJ_FILTER_OVERLONG": ("services/launcher/trainer/loop.py",),
    "TRAJ_FILTER_ERROR": ("services/launcher/trainer/loop.py",),
    "EVAL_ON_CHECKPOINT": ("services/launcher/evals.py",),
    "EVAL_DATASET": ("services/launcher/evals.py",),
    "EVAL_N_TRIALS": ("services/launcher/evals.py",),
    "EVAL_TEMPERATURE": ("services/launcher/evals.py",),
}  # fmt: skip

#: Key → a value ENGINE=verl refuses (with what the refusal says).
REFUSED_VERL: dict[str, tuple[str, str]] = {
    "PARTIAL_ROLLOUT": ("1", "these keys shape the fully async mode"),
    "STALENESS": ("0.5", "these keys shape the fully async mode"),
    "REQUIRE_BATCHES": ("2", "these keys shape the fully async mode"),
    "TRIGGER_PARAMETER_SYNC_STEP": ("2", "these keys shape the fully async mode"),
    "TOTAL_ROLLOUT_STEPS": ("10", "these keys shape the fully async mode"),
    "MODEL_ENGINE": ("veomni", "the VeOmni trainer config is not wired yet"),
    "VEOMNI_FUSED_KERNELS": ("0", "the VeOmni trainer config is not wired yet"),
    "VEOMNI_ACTIVATION_OFFLOAD": ("0", "the VeOmni trainer config is not wired yet"),
    "EP_SIZE": ("1", "the VeOmni trainer config is not wired yet"),
    "GEN_DP": ("3", "one rollout replica per GEN_TP GPUs of the rollout nodes"),
    "VLLM_READY_TIMEOUT": ("100", "verl starts its own vLLM servers"),
    "VAL_AGENT_TIMEOUT_SEC": ("60", "tells a validation sample by VAL_TEMPERATURE"),
}


#: Key → a value ENGINE=verl refuses in TRAINING_MODE=async (with what the refusal says).
REFUSED_VERL_ASYNC: dict[str, tuple[str, str]] = {
    "PARTIAL_ROLLOUT": ("1", "token-level resume of a cut turn is not built"),
    "TRAIN_BSZ": ("8", "feeds tasks one at a time"),
    "TOTAL_TRAINING_STEPS": ("10", "counts its steps from the rollouts"),
    "GEN_DP": ("3", "N_NODES_ROLLOUT in async"),
}
VERL_ASYNC = "ENGINE=verl\nTRAINING_MODE=async\nNNODES=2\nN_NODES_ROLLOUT=1\nNGPUS_PER_NODE=8\nGEN_TP=1\n"


#: Keys that are variables for other keys' values (``${MODEL_ROOT}/name``): the loader interpolates them.
VARIABLES = ("MODEL_ROOT",)

#: Key → (a value this build does not carry out, what the refusal says), for ENGINE=local infer and eval.
REFUSED: dict[str, tuple[str, str]] = {
    "ENGINE": ("verl", "ENGINE=verl carries train runs"),
    "SCAFFOLD": ("oh", "full OpenHands (oh) runs its own runtime containers"),
    "AGENT_NETWORK": ("allowlist", "no sandbox backend enforces an egress allowlist yet"),
    "AGENT_ALLOWED_HOSTS": ("pypi.org", "only an egress allowlist reads AGENT_ALLOWED_HOSTS"),
    "DATASET_NAME": ("terminal-bench", "no registry of named datasets yet"),
    "LOGGER": ("console,tensorboard", "metric loggers are not wired into it yet"),
    "FAKE_NUM_STEPS": ("7", "steer ENGINE=fake's synthetic events only"),
    "FAKE_STEP_DELAY_SEC": ("1", "steer ENGINE=fake's synthetic events only"),
    "FAKE_FAIL_AT": ("loop", "steer ENGINE=fake's synthetic events only"),
}

BASE = {
    "eval": (
        "RUN_TYPE=eval\nTEAM=nlp\nPROJECT_NAME=p\nEXP_NAME=keys\nMODEL_PATH=${RUNCTL_TEST_DATA}/models/llama-tiny\n"
        "DATASET_PATH=${RUNCTL_TEST_DATA}/tasks\nNGPUS_PER_NODE=0\nGEN_TP=1\nMAX_MODEL_LEN=512\n"
    ),
    "infer": (
        "RUN_TYPE=infer\nTEAM=nlp\nPROJECT_NAME=p\nEXP_NAME=keys\nMODEL_PATH=${RUNCTL_TEST_DATA}/models/llama-tiny\n"
        "INDEX_FILE=${RUNCTL_TEST_DATA}/tasks\nNGPUS_PER_NODE=0\nGEN_TP=1\nMAX_MODEL_LEN=512\n"
    ),
    "train": (
        "RUN_TYPE=train\nTEAM=nlp\nPROJECT_NAME=p\nEXP_NAME=keys\nMODEL_PATH=${RUNCTL_TEST_DATA}/models/llama-tiny\n"
        "TRAIN_FILES=${RUNCTL_TEST_DATA}/tasks\nNGPUS_PER_NODE=0\nGEN_TP=1\n"
    ),
}


def template_keys(run_type: str) -> list[str]:
    text = (TEMPLATES / f"{run_type}.env").read_text()
    return sorted(set(re.findall(r"^(?:# )?([A-Z][A-Z0-9_]+)=", text, re.M)))


def results(run_type: str, extra: str) -> list[CheckResult]:
    resolved = resolve_text(BASE[run_type] + extra, "run.env", environ={"RUNCTL_TEST_DATA": str(DATA)})
    return check_config(resolved.model)


@cache
def attributes_read(module: str) -> frozenset[str]:
    """Every ``x.<name>`` a module reads."""
    tree = ast.parse((ROOT / module).read_text())
    return frozenset(node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute))


@pytest.mark.parametrize("run_type", ["eval", "infer"])
def test_every_template_key_is_honoured_or_refused(run_type: str) -> None:
    keys = template_keys(run_type)
    assert len(keys) > 40
    unclassified = [k for k in keys if k not in HONOURED and k not in REFUSED and k not in VARIABLES]
    assert unclassified == [], f"say where these are read, or refuse them: {unclassified}"


@pytest.mark.parametrize(
    ("key", "modules"), [*sorted(HONOURED.items()), *sorted(HONOURED_TRAIN.items())], ids=lambda v: str(v)
)
def test_an_honoured_key_is_read_where_the_table_says(key: str, modules: tuple[str, ...]) -> None:
    field = key.lower()
    readers = [m for m in modules if field in attributes_read(m)]
    assert readers, f"{key}: none of {modules} reads .{field}"


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_a_refused_key_is_fatal_with_what_is_not_built(key: str) -> None:
    value, says = REFUSED[key]
    extra = f"{key}={value}\n" + ("AGENT_NAME=openhands\n" if key == "SCAFFOLD" else "")
    if key == "DATASET_NAME":
        extra += "DATASET_PATH=\n"
    fatal = [r for r in results("eval", extra) if r.severity == "fatal"]
    assert [r.id for r in fatal] == ["engine.not_built"], fatal
    assert says in fatal[0].message and key.rstrip("*") in fatal[0].message and fatal[0].fix


def test_a_variable_key_is_interpolated_into_the_keys_that_use_it() -> None:
    text = BASE["eval"] + f"MODEL_ROOT={DATA / 'models'}\nMODEL_PATH=${{MODEL_ROOT}}/llama-tiny\n"
    resolved = resolve_text(text, "run.env", environ={"RUNCTL_TEST_DATA": str(DATA)})
    assert resolved.model.model_path == str(DATA / "models" / "llama-tiny")


def test_the_honoured_values_of_refused_keys_pass() -> None:
    fine = "PRIORITY=normal\nSCAFFOLD=terminal\nAGENT_NETWORK=public\nLOGGER=console\n"
    assert not [r for r in results("eval", fine) if r.severity == "fatal"]


def test_a_verl_train_run_asks_nothing_that_is_not_built() -> None:
    (verdict,) = [r for r in results("train", "ENGINE=verl\n") if r.id == "engine.not_built"]
    assert verdict.severity == "ok", verdict


def test_every_train_template_key_is_honoured_or_refused_for_verl() -> None:
    keys = template_keys("train")
    known = set(HONOURED) | set(HONOURED_VERL) | set(REFUSED) | set(REFUSED_VERL) | set(VARIABLES)
    unclassified = [k for k in keys if k not in known]
    assert unclassified == [], f"say where these are read, or refuse them: {unclassified}"


@pytest.mark.parametrize(("key", "modules"), sorted(HONOURED_VERL.items()), ids=lambda v: str(v))
def test_a_key_honoured_for_verl_is_read_where_the_table_says(key: str, modules: tuple[str, ...]) -> None:
    readers = [m for m in modules if key.lower() in attributes_read(m)]
    assert readers, f"{key}: none of {modules} reads .{key.lower()}"


@pytest.mark.parametrize("key", sorted(REFUSED_VERL))
def test_a_key_verl_cannot_carry_out_is_refused_with_the_reason(key: str) -> None:
    value, says = REFUSED_VERL[key]
    extra = "ENGINE=verl\nNGPUS_PER_NODE=8\nGEN_TP=1\n" + f"{key}={value}\n"
    if key == "VAL_AGENT_TIMEOUT_SEC":
        extra += "VAL_TEMPERATURE=1.0\n"  # the same as TEMPERATURE: a validation sample cannot be told apart
    fatal = [r for r in results("train", extra) if r.severity == "fatal" and r.id == "engine.not_built"]
    assert fatal, f"{key}={value} is not refused for ENGINE=verl"
    assert says in fatal[0].message and key in fatal[0].message and fatal[0].fix


def test_a_fully_async_verl_run_asks_nothing_that_is_not_built() -> None:
    verdicts = {r.id: r for r in results("train", VERL_ASYNC + "STALENESS=0.5\nTOTAL_ROLLOUT_STEPS=64\n")}
    assert verdicts["engine.not_built"].severity == "ok", verdicts["engine.not_built"]
    assert verdicts["verl.compose"].severity == "ok" and "fully_async_ppo_trainer" in verdicts["verl.compose"].message


@pytest.mark.parametrize("key", sorted(REFUSED_VERL_ASYNC))
def test_a_key_verls_fully_async_mode_cannot_carry_out_is_refused_with_the_reason(key: str) -> None:
    value, says = REFUSED_VERL_ASYNC[key]
    fatal = [r for r in results("train", VERL_ASYNC + f"{key}={value}\n") if r.id == "engine.not_built"]
    assert fatal and fatal[0].severity == "fatal", f"{key}={value} is not refused for verl's async mode"
    assert says in fatal[0].message and key in fatal[0].message and fatal[0].fix


def test_a_local_train_run_asks_nothing_that_is_not_built() -> None:
    (verdict,) = [r for r in results("train", "ENGINE=local\n") if r.id == "engine.not_built"]
    assert verdict.severity == "ok", verdict


def test_every_train_template_key_is_honoured_or_refused_for_the_local_trainer() -> None:
    keys = template_keys("train")
    known = set(HONOURED) | set(HONOURED_TRAIN) | set(REFUSED) | set(REFUSED_TRAIN) | set(VARIABLES)
    unclassified = [k for k in keys if k not in known]
    assert unclassified == [], f"say where these are read, or refuse them: {unclassified}"


@pytest.mark.parametrize("key", sorted(REFUSED_TRAIN))
def test_a_key_the_local_trainer_cannot_carry_out_is_refused_with_the_reason(key: str) -> None:
    value, says = REFUSED_TRAIN[key]
    fatal = [r for r in results("train", f"ENGINE=local\n{key}={value}\n") if r.severity == "fatal"]
    assert "engine.not_built" in [r.id for r in fatal], fatal
    verdict = next(r for r in fatal if r.id == "engine.not_built")
    assert says in verdict.message and key in verdict.message and verdict.fix


def test_a_synthetic_train_run_names_every_template_key_it_ignores() -> None:
    # ENGINE=fake is a preview of the lifecycle: it reads its own keys; every other key set is named in a warning.
    keys = [k for k in template_keys("train") if k not in BASE["train"] and not k.startswith("FAKE_")]
    samples = {"ACTOR_LR": "0.001", "SP_SIZE": "2", "ADV_ESTIMATOR": "rloo", "TOTAL_EPOCHS": "3"}
    assert set(samples) <= set(keys)
    extra = "ENGINE=fake\n" + "".join(f"{k}={v}\n" for k, v in samples.items())
    (verdict,) = [r for r in results("train", extra) if r.id == "engine.not_built"]
    assert verdict.severity == "warn" and "change nothing in this run" in verdict.message
    for key in ("ACTOR_LR", "ADV_ESTIMATOR", "SP_SIZE"):
        assert key in verdict.message


def test_a_refused_key_is_refused_before_launch_by_the_runner_too() -> None:
    # The same table the validator reads: the runner's own pass of the validator refuses it just the same.
    from services.validator.rules import NOT_BUILT

    assert {row.key for row in NOT_BUILT} >= {k for k in REFUSED if not k.startswith("FAKE_")} | {"FAKE_*"}


def test_the_table_names_modules_that_exist() -> None:
    for modules in [*HONOURED.values(), *HONOURED_TRAIN.values(), *HONOURED_VERL.values()]:
        for module in modules:
            assert Path(ROOT / module).is_file(), module
