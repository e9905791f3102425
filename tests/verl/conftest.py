"""verl's own classes on CPU (its ``*_on_cpu.py`` pattern): a train config for ENGINE=verl on the tiny model, and
verl's config tree composed with runctl's overrides for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runctl.config import TrainConfig
from runctl.config.loader import validate_settings
from runctl.verl import verl_overrides
from services.validator.checks.verl_schema import verl_config_dir
from tests.conftest import ROOT
from tests.infra import vllm_server as vllm_infra

EXAMPLE_TASKS = ROOT / "examples" / "tasks"


def verl_train_config(**values: object) -> TrainConfig:
    base = {"RUN_TYPE": "train", "ENGINE": "verl", "PROJECT_NAME": "p", "EXP_NAME": "verl-cpu",
            "MODEL_PATH": str(vllm_infra.tiny_model()), "TRAIN_FILES": str(EXAMPLE_TASKS), "NGPUS_PER_NODE": "1",
            "GEN_TP": "1", "TRAIN_BSZ": "3", "TRAIN_MINI_BSZ": "3", "N_RESP": "2", "MAX_PROMPT": "4096",
            "MAX_RESP": "2048", "BACKEND": "local", "AGENT_MAX_ITERATIONS": "3", "AGENT_TIMEOUT_SEC": "60",
            "SERVED_MODEL_NAME": "fake-model"}  # fmt: skip
    made = validate_settings("train", {**base, **{k: str(v) for k, v in values.items()}}, "test")
    assert isinstance(made, TrainConfig)
    return made


def composed(config: TrainConfig, run_dir: Path) -> Any:
    """verl's trainer config as verl's entry point would see it with runctl's overrides."""
    from hydra import compose, initialize_config_dir

    config_dir = verl_config_dir()
    assert config_dir is not None, "verl's config files must be installed (scripts/setup.sh does it)"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose("ppo_trainer", overrides=verl_overrides(config, str(run_dir)))
