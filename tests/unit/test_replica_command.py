"""A replica's command line and environment (services/launcher/rollout/replicas.py), on CPU and on GPU."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from runctl.config import load_config
from services.launcher.rollout.replicas import GUARD_DIR, GUARD_MIDDLEWARE, vllm_argv, vllm_env, with_guard
from tests.conftest import ROOT


def infer_config(tmp_path: Path, **values: str) -> object:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    environ = {"MODEL_PATH": str(model), **values}
    return load_config(ROOT / "configs" / "examples" / "infer-cpu.env", environ=environ).model


def test_a_cpu_replica_runs_eager_in_float32_with_its_model_in_the_engine_process(tmp_path: Path) -> None:
    argv = vllm_argv(infer_config(tmp_path), "python", "127.0.0.1", 8000)  # type: ignore[arg-type]
    assert argv[1:3] == ["-m", "runctl_replica_serve"]  # vLLM's server, its engine core forked (below)
    assert "--enforce-eager" in argv and argv[argv.index("--dtype") + 1] == "float32"
    assert "--tensor-parallel-size" not in argv
    env = vllm_env("127.0.0.1", cpu=True, key="k")
    # One process fewer per replica: the model runs in the engine core (bench/replica_start.py measures the gain).
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["VLLM_CPU_KVCACHE_SPACE"]
    # Nothing compiled at its first request (the logprob op vLLM compiles with inductor and a C++ compiler).
    assert env["TORCH_COMPILE_DISABLE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in env
    assert vllm_env("127.0.0.1", cpu=True, key="k", dev_mode=True)["VLLM_SERVER_DEV_MODE"]


def test_a_gpu_replica_keeps_vllms_own_process_layout(tmp_path: Path) -> None:
    config = infer_config(tmp_path).model_copy(update={"ngpus_per_node": 1})  # type: ignore[attr-defined]
    assert vllm_argv(config, "python", "10.0.0.1", 8000)[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # type: ignore[arg-type]
    env = vllm_env("10.0.0.1", cpu=False, key="k")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert "TORCH_COMPILE_DISABLE" not in env  # CUDA graphs and vLLM's compiled model are what a GPU replica is for
    assert env["VLLM_HOST_IP"] == "10.0.0.1"


def test_every_replica_requires_its_runs_key_on_every_path_but_health(tmp_path: Path) -> None:
    argv = vllm_argv(infer_config(tmp_path), "python", "127.0.0.1", 8000)  # type: ignore[arg-type]
    assert argv[argv.index("--middleware") + 1] == GUARD_MIDDLEWARE == "runctl_replica_guard.RequireKey"
    env = vllm_env("127.0.0.1", cpu=True, key="the-runs-key")
    assert env["VLLM_API_KEY"] == "the-runs-key" and "the-runs-key" not in " ".join(argv)  # not on the command line
    # Any Python with vLLM finds the guard, whether or not runctl is installed beside it.
    assert (GUARD_DIR / "runctl_replica_guard.py").is_file()
    assert with_guard(None) == str(GUARD_DIR) and with_guard("/x") == f"{GUARD_DIR}:/x"


class CpuPlatform:
    """vLLM's CPU platform as far as runctl_replica_serve touches it: it sets spawn, whatever was asked."""

    @classmethod
    def check_and_update_config(cls, vllm_config: object) -> None:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """runctl_replica_serve, imported as a replica imports it (its folder on the path), over a fake CPU platform."""
    monkeypatch.syspath_prepend(str(GUARD_DIR))
    platforms = types.ModuleType("vllm.platforms")
    platforms.cpu = types.SimpleNamespace(CpuPlatform=type("CpuPlatform", (CpuPlatform,), {}))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    import runctl_replica_serve

    return runctl_replica_serve


def test_a_cpu_replica_forks_its_engine_core_unless_its_environment_asks_for_spawn(
    serve: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM's CPU platform sets spawn, so the engine core imported torch and vLLM again: ~15 CPU-s per replica.
    platform = sys.modules["vllm.platforms"].cpu.CpuPlatform  # type: ignore[attr-defined]
    assert serve.fork_engine_core()
    platform.check_and_update_config(object())
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    # The way back: spawn asked for in the replica's environment is what vLLM gets.
    monkeypatch.setattr(platform, "check_and_update_config", CpuPlatform.check_and_update_config)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert not serve.fork_engine_core()
    platform.check_and_update_config(object())
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    # A vLLM whose CPU platform has no such method: served as vLLM serves it.
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD")
    monkeypatch.setattr(sys.modules["vllm.platforms"], "cpu", types.SimpleNamespace())
    assert not serve.fork_engine_core()
