"""engine.verl_runtime: the run's Python can import verl's runtime, and a head started here has the GPUs asked for."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runctl.config import TrainConfig
from runctl.config.loader import validate_settings
from runctl.events import CheckResult
from services.validator.library import check_config
from tests.conftest import ROOT


def verdict(monkeypatch: pytest.MonkeyPatch, ray_address: str | None = None, **values: str) -> CheckResult:
    if ray_address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", ray_address)
    model, tasks = str(ROOT / "tests/data/models/llama-tiny"), str(ROOT / "examples/tasks")
    base = {"RUN_TYPE": "train", "ENGINE": "verl", "PROJECT_NAME": "p", "EXP_NAME": "e", "GEN_TP": "1",
            "MODEL_PATH": model, "TRAIN_FILES": tasks}  # fmt: skip
    config = validate_settings("train", {**base, **values}, "test")
    assert isinstance(config, TrainConfig)
    (found,) = [r for r in check_config(config, host=True) if r.id == "engine.verl_runtime"]
    return found


def test_a_python_without_verl_is_refused_with_the_gpu_set_as_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # The system Python has none of the GPU set (it is a venv's base interpreter).
    bare = Path(sys.base_prefix)
    result = verdict(monkeypatch, VENV_PATH=str(bare), NGPUS_PER_NODE="0")
    assert result.severity == "fatal"
    assert "verl" in result.message and f"VENV_PATH={bare}" in result.message
    assert "setup.sh --gpu" in result.fix


def test_a_head_started_here_needs_the_gpus_the_run_asks_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # This interpreter has verl, vLLM, torch and Ray (the test set installs them); this machine has no GPU.
    result = verdict(monkeypatch, NGPUS_PER_NODE="2")
    assert result.severity == "fatal" and "has 0 GPU(s)" in result.message and "asks for 2" in result.message
    assert "RAY_ADDRESS" in result.fix
    assert verdict(monkeypatch, NGPUS_PER_NODE="0").severity == "ok"


def test_a_clusters_gpus_are_left_to_the_topology_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    result = verdict(monkeypatch, ray_address="127.0.0.1:6379", NGPUS_PER_NODE="8")
    assert result.severity == "ok" and "topology.ray_cluster" in result.message


def test_other_engines_skip_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert verdict(monkeypatch, ENGINE="local", NGPUS_PER_NODE="0").severity == "skip"
