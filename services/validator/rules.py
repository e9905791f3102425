"""The data behind the checks: which tool parsers fit which model family, which agent names each scaffold has,
and what each training engine supports. A new model family or scaffold is a row here, not an if-chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeGuard

from runctl.config.models import RunConfig, TrainConfig

#: vLLM tool-call parsers that read the tool-call format each model family was trained on (``model_type``).
PARSERS_BY_FAMILY: dict[str, frozenset[str]] = {
    "qwen2": frozenset({"hermes"}),
    "qwen2_moe": frozenset({"hermes"}),
    "qwen3": frozenset({"hermes", "qwen3_coder", "qwen3_xml"}),
    "qwen3_moe": frozenset({"hermes", "qwen3_coder", "qwen3_xml"}),
    "qwen3_next": frozenset({"hermes", "qwen3_coder", "qwen3_xml"}),
    "llama": frozenset({"llama3_json", "llama4_json", "llama4_pythonic", "pythonic", "hermes"}),
    "llama4": frozenset({"llama4_json", "llama4_pythonic", "pythonic"}),
    "mistral": frozenset({"mistral"}),
    "mixtral": frozenset({"mistral"}),
    "deepseek_v3": frozenset({"deepseek_v3", "deepseek_v31"}),
    "glm4_moe": frozenset({"glm45"}),
    "gpt_oss": frozenset({"openai"}),
    "kimi_k2": frozenset({"kimi_k2"}),
    "granite": frozenset({"granite", "granite-20b-fc"}),
    "internlm2": frozenset({"internlm"}),
    "minimax_m2": frozenset({"minimax_m2"}),
}

#: Where each scaffold's agent gets its tool calls: "server" — it sends tools, and vLLM's TOOL_CALL_PARSER turns the
#: model's output into the calls it reads — or "text": it parses its commands out of the model's text itself
#: (mini-swe-agent: one bash block per answer), so no parser is in its way.
TOOL_CALLS_BY_SCAFFOLD: dict[str, str] = {
    "terminal": "server",
    "installed": "server",
    "mswea": "text",
    "ohsdk": "server",
    "oh": "server",
    "cc": "server",
    "oc": "server",
}

#: The scaffolds whose agent runs inside the sandbox (services/launcher/rollout/agents/installed.py: IN_SANDBOX).
IN_SANDBOX_SCAFFOLDS = ("installed", "mswea", "cc", "oc", "ohsdk")

#: Agent loop names each scaffold provides; the first is its default.
AGENTS_BY_SCAFFOLD: dict[str, tuple[str, ...]] = {
    # oracle and nop call no model: they run a task's solution, or nothing (scoring checks of a task set).
    "terminal": ("terminal", "oracle", "nop"),
    "installed": ("installed",),
    "mswea": ("mswea",),
    "ohsdk": ("openhands_sdk",),
    "oh": ("openhands", "codeact"),
    "cc": ("claude_code",),
    "oc": ("opencode",),
}


@dataclass(frozen=True)
class EngineFeatures:
    """What a training backend supports."""

    routing_replay: bool
    sequence_parallel_with_r3: bool
    forbidden_flags: tuple[str, ...]


ENGINES: dict[str, EngineFeatures] = {
    "fsdp": EngineFeatures(routing_replay=True, sequence_parallel_with_r3=False, forbidden_flags=()),
    "veomni": EngineFeatures(
        routing_replay=True,
        sequence_parallel_with_r3=True,
        forbidden_flags=("VEOMNI_FUSED_KERNELS", "VEOMNI_ACTIVATION_OFFLOAD"),
    ),
}

#: Advantage estimators that compare a task's responses with each other: one response per task gives no signal.
GROUP_ESTIMATORS = frozenset({"grpo", "rloo", "opo", "gpg"})

#: Learning-rate schedules that decay over a known number of steps.
DECAYING_SCHEDULES = frozenset({"cosine", "linear"})


@dataclass(frozen=True)
class LoggerNeeds:
    """What a metric logger needs from the run's environment before it can start."""

    any_of: tuple[str, ...]
    """Environment variables, any one of which holds the credentials or the server."""
    free_modes: tuple[str, str] | None
    """(variable, comma-separated modes) under which it needs none: a local or offline mode."""
    severity: Literal["fatal", "warn"]
    """fatal: the logger fails at start; warn: it falls back to something the user likely did not mean."""
    consequence: str


#: Metric loggers (verl's ``trainer.logger``) that need credentials or a server; the rest need nothing.
LOGGER_NEEDS: dict[str, LoggerNeeds] = {
    "wandb": LoggerNeeds(
        ("WANDB_API_KEY",), ("WANDB_MODE", "offline,disabled"), "fatal", "wandb cannot log in: the run fails at start"
    ),
    "swanlab": LoggerNeeds(
        ("SWANLAB_API_KEY",),
        ("SWANLAB_MODE", "local,offline,disabled"),
        "fatal",
        "swanlab cannot log in: the run fails at start",
    ),
    "clearml": LoggerNeeds(
        ("CLEARML_API_ACCESS_KEY", "CLEARML_CONFIG_FILE"),
        None,
        "fatal",
        "clearml finds no credentials: the run fails at start",
    ),
    "mlflow": LoggerNeeds(
        ("MLFLOW_TRACKING_URI",),
        None,
        "warn",
        "mlflow writes to ./mlruns on the trainer's node, not to a tracking server",
    ),
}


@dataclass(frozen=True)
class NotBuilt:
    """A setting this build accepts in a config but does not carry out: the validator refuses it, naming it."""

    key: str
    applies: Callable[[RunConfig], bool]
    """True when the config asks for what is not built."""
    missing: str
    """What is not built, said to the user."""
    fix: str


def _agent_scaffold(c: RunConfig) -> bool:
    return c.scaffold == "oh"


def _local_train(c: RunConfig) -> TypeGuard[TrainConfig]:
    return isinstance(c, TrainConfig) and c.engine == "local"


def _set(c: RunConfig, *names: str) -> bool:
    return any(n in c.model_fields_set for n in names)


#: The keys of verl's fully async mode.
ASYNC_KEYS = ("partial_rollout", "staleness", "require_batches", "trigger_parameter_sync_step", "total_rollout_steps")
_TRL = "ENGINE=local trains with TRL's GRPOTrainer on one machine"
#: What ENGINE=local's trainer (TRL's GRPO, one process) cannot carry out: refused with the reason, never ignored.
LOCAL_TRAINER_REFUSES: tuple[NotBuilt, ...] = (
    NotBuilt(
        "TRAINING_MODE",
        lambda c: _local_train(c) and c.training_mode == "async",
        f"{_TRL}, rollout and update taking turns; the fully async mode is verl's",
        "TRAINING_MODE=sync (the default), or ENGINE=verl",
    ),
    NotBuilt(
        "ADV_ESTIMATOR",
        lambda c: _local_train(c) and c.adv_estimator != "grpo",
        f"{_TRL}: GRPO's group-normalised advantages are the only estimator it has",
        "ADV_ESTIMATOR=grpo, or ENGINE=verl",
    ),
    NotBuilt(
        "POLICY_LOSS_MODE",
        lambda c: _local_train(c) and c.policy_loss_mode not in ("vanilla", "gspo"),
        f"{_TRL}: it clips the token-level ratio (vanilla) or the sequence-level one (gspo); the other losses are "
        "verl's",
        "POLICY_LOSS_MODE=vanilla or gspo, or ENGINE=verl",
    ),
    NotBuilt(
        "ROLLOUT_IS",
        lambda c: _local_train(c) and c.rollout_is is not None,
        f"{_TRL}; its rollout importance-sampling correction works only with TRL's own vLLM client, which cannot "
        "sync weights on CPU",
        "leave ROLLOUT_IS unset (the update is on-policy: one update per rollout)",
    ),
    NotBuilt(
        "TRAIN_MINI_BSZ",
        lambda c: _local_train(c) and _set(c, "train_mini_bsz") and c.train_mini_bsz != c.train_bsz,
        f"{_TRL}, one update per step on the whole batch (mini-batches are verl's)",
        "remove TRAIN_MINI_BSZ (or set it to TRAIN_BSZ)",
    ),
    NotBuilt(
        "NNODES",
        lambda c: _local_train(c) and c.nnodes > 1,
        f"{_TRL}: the trainer and the weights it syncs stay on the runner's machine",
        "NNODES=1, or ENGINE=verl for a multi-node run",
    ),
    NotBuilt(
        "MODEL_ENGINE, SP_SIZE, EP_SIZE, N_NODES_TRAIN, N_NODES_ROLLOUT, USE_DYNAMIC_BSZ, ENABLE_R3, VEOMNI_*",
        lambda c: (
            _local_train(c)
            and _set(
                c,
                "model_engine",
                "sp_size",
                "ep_size",
                "n_nodes_train",
                "n_nodes_rollout",
                "use_dynamic_bsz",
                "enable_r3",
                "veomni_fused_kernels",
                "veomni_activation_offload",
            )
        ),
        f"{_TRL} in one process: these keys shape verl's distributed trainer",
        "remove them, or set ENGINE=verl",
    ),
    NotBuilt(
        "PARTIAL_ROLLOUT, STALENESS, REQUIRE_BATCHES, TRIGGER_PARAMETER_SYNC_STEP, TOTAL_ROLLOUT_STEPS",
        lambda c: _local_train(c) and _set(c, *ASYNC_KEYS),
        f"{_TRL} synchronously: these keys steer verl's fully async mode",
        "remove them, or set ENGINE=verl with TRAINING_MODE=async",
    ),
    NotBuilt(
        "VAL_FILES, TEST_FREQ, VAL_BEFORE_TRAIN, VAL_TEMPERATURE, VAL_AGENT_TIMEOUT_SEC",
        lambda c: (
            _local_train(c)
            and _set(c, "val_files", "test_freq", "val_before_train", "val_temperature", "val_agent_timeout_sec")
        ),
        f"{_TRL}; it validates through eval runs of its checkpoints, not inside the training loop",
        "remove them and set EVAL_ON_CHECKPOINT=1 with EVAL_DATASET (each checkpoint gets its own eval run)",
    ),
    NotBuilt(
        "GPU_MEM_UTIL",
        lambda c: c.engine == "local" and c.ngpus_per_node == 0 and _set(c, "gpu_mem_util"),
        "vLLM on CPU has no GPU memory to share (its KV cache is VLLM_CPU_KVCACHE_SPACE in the environment)",
        "remove GPU_MEM_UTIL",
    ),
)


def _verl_train(c: RunConfig) -> TypeGuard[TrainConfig]:
    return isinstance(c, TrainConfig) and c.engine == "verl"


_VERL = "ENGINE=verl runs verl's synchronous PPO trainer (main_ppo) with runctl's agent loop"
_VERL_ASYNC = "ENGINE=verl with TRAINING_MODE=async runs verl's fully async trainer (fully_async_main)"


def _verl_async(c: RunConfig) -> TypeGuard[TrainConfig]:
    return _verl_train(c) and c.training_mode == "async"


#: What ENGINE=verl does not carry out (yet): refused with the reason, never ignored.
VERL_REFUSES: tuple[NotBuilt, ...] = (
    NotBuilt(
        "ENGINE",
        lambda c: c.engine == "verl" and c.run_type != "train",
        "ENGINE=verl carries train runs; infer and eval runs are served by ENGINE=local (vLLM on a GPU or the CPU)",
        "ENGINE=local",
    ),
    NotBuilt(
        "PARTIAL_ROLLOUT, STALENESS, REQUIRE_BATCHES, TRIGGER_PARAMETER_SYNC_STEP, TOTAL_ROLLOUT_STEPS",
        lambda c: _verl_train(c) and c.training_mode == "sync" and _set(c, *ASYNC_KEYS),
        f"{_VERL}, rollout and training sharing every GPU in turn: these keys shape the fully async mode",
        "set TRAINING_MODE=async, or remove them",
    ),
    NotBuilt(
        "PARTIAL_ROLLOUT",
        lambda c: _verl_async(c) and c.partial_rollout,
        f"{_VERL_ASYNC}: its agents reach verl's servers through runctl's proxy, which sends a turn cut short by a "
        "weight update again whole, on the new weights (a turn's tokens all come from one policy version); a "
        "token-level resume of a cut turn is not built",
        "remove PARTIAL_ROLLOUT",
    ),
    NotBuilt(
        "TRAIN_BSZ",
        lambda c: _verl_async(c) and _set(c, "train_bsz"),
        f"{_VERL_ASYNC}: its rollouter feeds tasks one at a time, and a step trains on TRAIN_MINI_BSZ × "
        "REQUIRE_BATCHES tasks",
        "remove TRAIN_BSZ; set TRAIN_MINI_BSZ and REQUIRE_BATCHES for the tasks of a step",
    ),
    NotBuilt(
        "TOTAL_TRAINING_STEPS",
        lambda c: _verl_async(c) and _set(c, "total_training_steps"),
        f"{_VERL_ASYNC}: it counts its steps from the rollouts, TOTAL_ROLLOUT_STEPS ÷ (TRAIN_MINI_BSZ × "
        "REQUIRE_BATCHES × TRIGGER_PARAMETER_SYNC_STEP)",
        "remove TOTAL_TRAINING_STEPS and set TOTAL_ROLLOUT_STEPS (tasks to roll out in all)",
    ),
    NotBuilt(
        "MODEL_ENGINE, VEOMNI_*, EP_SIZE",
        lambda c: (
            _verl_train(c)
            and (c.model_engine != "fsdp" or _set(c, "veomni_fused_kernels", "veomni_activation_offload", "ep_size"))
        ),
        f"{_VERL} on FSDP; the VeOmni trainer config is not wired yet",
        "MODEL_ENGINE=fsdp (the default), and remove VEOMNI_* and EP_SIZE",
    ),
    NotBuilt(
        "GEN_DP",
        lambda c: (
            _verl_train(c)
            and _set(c, "gen_dp")
            and c.gen_dp * c.gen_tp
            != (c.nnodes if c.training_mode == "sync" else c.n_nodes_rollout or 0) * c.ngpus_per_node
        ),
        "verl makes one rollout replica per GEN_TP GPUs of the rollout nodes (every node in sync mode, "
        "N_NODES_ROLLOUT in async); it takes no replica count",
        "remove GEN_DP, or set it to (NNODES, or N_NODES_ROLLOUT in async) × NGPUS_PER_NODE ÷ GEN_TP",
    ),
    NotBuilt(
        "VLLM_READY_TIMEOUT",
        lambda c: _verl_train(c) and _set(c, "vllm_ready_timeout"),
        "verl starts its own vLLM servers and waits for them itself",
        "remove VLLM_READY_TIMEOUT",
    ),
    NotBuilt(
        "VAL_AGENT_TIMEOUT_SEC",
        lambda c: (
            _verl_train(c)
            and _set(c, "val_agent_timeout_sec")
            and c.val_temperature == c.temperature
            and c.val_agent_timeout_sec != c.agent_timeout_sec
        ),
        "runctl's agent loop inside verl tells a validation sample by VAL_TEMPERATURE (verl passes no other sign), "
        "and here it equals TEMPERATURE",
        "give VAL_TEMPERATURE a value of its own, or remove VAL_AGENT_TIMEOUT_SEC",
    ),
)


#: Everything a config can ask for that this build does not do. ENGINE=fake runs are previews: only the rows that
#: hold for every engine apply to them (``engine.not_built`` warns of the keys a synthetic run ignores).
NOT_BUILT: tuple[NotBuilt, ...] = (
    *VERL_REFUSES,
    *LOCAL_TRAINER_REFUSES,
    NotBuilt(
        "SCAFFOLD",
        lambda c: c.engine != "fake" and _agent_scaffold(c),
        "this build drives runctl's terminal agent, installed agents, mini-swe-agent (mswea), Claude Code (cc), "
        "OpenCode (oc) and the OpenHands SDK (ohsdk); full OpenHands (oh) runs its own runtime containers, which a "
        "sandbox does not hold",
        "SCAFFOLD=installed with AGENT_COMMAND set to the command that starts that agent inside the task's image",
    ),
    NotBuilt(
        "SCAFFOLD",
        lambda c: _verl_train(c) and c.scaffold in IN_SANDBOX_SCAFFOLDS,
        "an agent inside the sandbox (installed, mswea, cc, oc, ohsdk) reaches its proxy session through the proxy's "
        "Unix socket, which runctl's trial host inside verl does not open yet",
        "SCAFFOLD=terminal for ENGINE=verl, or ENGINE=local to train with an agent inside the sandbox",
    ),
    NotBuilt(
        "AGENT_NETWORK",
        lambda c: c.agent_network == "allowlist",
        "no sandbox backend enforces an egress allowlist yet",
        "AGENT_NETWORK=no-network, or public for tasks that need the network (or leave it unset)",
    ),
    NotBuilt(
        "AGENT_ALLOWED_HOSTS",
        lambda c: bool(c.agent_allowed_hosts.strip()),
        "only an egress allowlist reads AGENT_ALLOWED_HOSTS, and none is built yet",
        "remove AGENT_ALLOWED_HOSTS",
    ),
    NotBuilt(
        "DATASET_NAME",
        lambda c: getattr(c, "dataset_name", None) is not None,
        "there is no registry of named datasets yet",
        "set DATASET_PATH to the task index (parquet) or task folder instead",
    ),
    NotBuilt(
        "FAKE_*",
        lambda c: c.engine != "fake" and any(k.startswith("fake_") for k in c.model_fields_set),
        "the FAKE_* keys steer ENGINE=fake's synthetic events only; this run would ignore them",
        "remove the FAKE_* keys, or set ENGINE=fake for a synthetic preview",
    ),
    NotBuilt(
        "LOGGER",
        lambda c: c.engine == "local" and {n.strip() for n in c.logger.split(",") if n.strip()} - {"console"} != set(),
        "ENGINE=local reports through runctl's events (the tracker, `runctl run`'s display); metric loggers are not "
        "wired into it yet",
        "LOGGER=console (the default); the dashboard shows every event",
    ),
)
