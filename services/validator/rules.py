"""The data behind the checks: which tool parsers fit which model family, which agent names each scaffold has,
and what each training engine supports. A new model family or scaffold is a row here, not an if-chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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

#: Agent loop names each scaffold provides; the first is its default.
AGENTS_BY_SCAFFOLD: dict[str, tuple[str, ...]] = {
    # oracle and nop call no model: they run a task's solution, or nothing (scoring checks of a task set).
    "terminal": ("terminal", "oracle", "nop"),
    "installed": ("installed",),
    "ohsdk": ("openhands_sdk", "codeact"),
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
