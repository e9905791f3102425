"""What verl's Ray actors get of the runner's environment, through verl's own entry point: ``run_ppo`` composes
nothing here, but it is verl's code that hands ``ray.init`` its runtime environment, and an actor of the job (a
stand-in for verl's TaskRunner) reports what it sees. A reference left in verl's config (``${oc.env:…}``) would reach
the actors as its text; runctl's runtime-environment hook (runctl/verl.py) hands them the
values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runctl.verl import driver_env
from runctl.verl import runtime_env_hook as hook
from services.launcher.engines.verl.engine import WORKER_ENV
from tests.conftest import ROOT
from tests.infra import ray_head as ray_infra
from tests.verl.conftest import verl_train_config

pytestmark = pytest.mark.integration

_DRIVER = """
import json, os, sys
import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo import run_ppo
from services.proxy.library import ray_replica_addresses

config = OmegaConf.load(sys.argv[1])
OUT = sys.argv[2]

@ray.remote(num_cpus=0)
class StandIn:  # verl's TaskRunner's place: an actor of verl's job
    def run(self, config):
        names = ("RUNCTL_NATS_URL", "RUNCTL_HOME", "VLLM_API_KEY", "WANDB_API_KEY", "PATH_SECRET")
        seen = {k: os.environ.get(k) for k in names}
        seen["namespace"] = ray.get_runtime_context().namespace
        with open(OUT, "w") as f:
            json.dump(seen, f)

run_ppo(config, task_runner_class=StandIn)

@ray.remote(num_cpus=0)
class Server:  # one of this job's vLLM servers, named as verl names them
    def get_server_address(self):
        return "127.0.0.1", 9

server = Server.options(name="vllm_server_0_0").remote()
ray.get(server.get_server_address.remote())
seen = json.load(open(OUT))
seen["own"] = ray_replica_addresses(None, namespace=ray.get_runtime_context().namespace)
seen["every"] = ray_replica_addresses(None)
json.dump(seen, open(OUT, "w"))
"""


def test_the_hook_adds_what_the_runner_lists_and_keeps_what_verl_set(monkeypatch: pytest.MonkeyPatch) -> None:
    env = driver_env(
        {"RUNCTL_NATS_URL": "nats://u:p@h:1", "VLLM_API_KEY": "k", "OTHER": "x"}, [*WORKER_ENV, "VLLM_API_KEY"]
    )
    assert env["RAY_RUNTIME_ENV_HOOK"] == "runctl.verl.runtime_env_hook"
    assert env["RUNCTL_VERL_WORKER_ENV"] == "RUNCTL_NATS_URL,VLLM_API_KEY"  # only those set, nothing else
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    made = hook({"env_vars": {"VERL_FILE_LOGGER_PATH": "/r/steps.jsonl"}, "working_dir": None})
    assert made["env_vars"] == {"VERL_FILE_LOGGER_PATH": "/r/steps.jsonl", "RUNCTL_NATS_URL": "nats://u:p@h:1",
                                "VLLM_API_KEY": "k"}  # fmt: skip
    assert made["working_dir"] is None
    # A hook the site had set runs first.
    chained = driver_env({**env, "RAY_RUNTIME_ENV_HOOK": "tests.verl.test_worker_env.site_hook"}, ["VLLM_API_KEY"])
    monkeypatch.setenv("RUNCTL_VERL_NEXT_RUNTIME_ENV_HOOK", chained["RUNCTL_VERL_NEXT_RUNTIME_ENV_HOOK"])
    monkeypatch.setenv("RUNCTL_VERL_WORKER_ENV", chained["RUNCTL_VERL_WORKER_ENV"])
    assert hook(None)["env_vars"] == {"SITE": "1", "VLLM_API_KEY": "k"}


def site_hook(runtime_env: dict[str, object] | None) -> dict[str, object]:
    return {**(runtime_env or {}), "env_vars": {"SITE": "1"}}


@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(ray_infra.why_unavailable()), reason=str(ray_infra.why_unavailable()))
def test_verls_actors_get_the_values_the_runner_hands_them_and_no_other(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from runctl.verl import RAY_NAMESPACE_KEY, ray_namespace, verl_overrides
    from services.validator.checks.verl_schema import compose, verl_config_dir

    config = verl_train_config(LOGGER="console,wandb", WANDB_API_KEY="wandb-secret")
    config_dir = verl_config_dir()
    assert config_dir is not None
    # The overrides as the runner hands them to verl: its own, then the job's namespace (engine.py).
    overrides = [*verl_overrides(config, str(tmp_path / "run")), f"+{RAY_NAMESPACE_KEY}={ray_namespace('r1')}"]
    conf = tmp_path / "verl.yaml"
    conf.write_text(OmegaConf.to_yaml(compose(config_dir, overrides)))
    assert "replica-secret" not in conf.read_text() and "nats://" not in conf.read_text()
    out = tmp_path / "seen.json"
    with ray_infra.ray_head() as head:
        ray_infra.start_server_actor(head, 8)  # another job's server, in a namespace of its own ("verl")
        runner = {
            "RUNCTL_NATS_URL": "nats://run-login:secret@127.0.0.1:4222",
            "RUNCTL_HOME": str(tmp_path / "home"),
            "VLLM_API_KEY": "replica-secret",
            "WANDB_API_KEY": "wandb-secret",
            "PATH_SECRET": "not-listed",
        }
        listed = [*WORKER_ENV, "VLLM_API_KEY", "WANDB_API_KEY"]
        env = driver_env({**os.environ, **runner, "RAY_ADDRESS": head.gcs_address, "PYTHONPATH": str(ROOT)}, listed)
        ran = subprocess.run(
            [sys.executable, "-c", _DRIVER, str(conf), str(out)], env=env, capture_output=True, text=True, timeout=240
        )
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    seen = json.loads(out.read_text())
    # The job runs in the run's namespace, where runctl looks for its servers: another job's are not taken for its own.
    assert seen.pop("namespace") == "runctl-verl-r1"
    assert seen.pop("own") == {"runctl-verl-r1/vllm_server_0_0": "http://127.0.0.1:9"}
    assert set(seen.pop("every")) == {"runctl-verl-r1/vllm_server_0_0", "verl/vllm_server_0_0"}
    assert seen == {**{k: runner[k] for k in listed if k in runner}, "PATH_SECRET": None}
