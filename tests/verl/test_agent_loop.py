"""runctl's agent loop inside verl's own AgentLoopWorker, on CPU: verl's dataset reads runctl's rows, verl's worker
runs runctl's loop for each sample (a real sandbox, the terminal agent, a proxy session over a stand-in vLLM server),
and verl's own postprocessing turns the outputs into the batch it trains on. The batch must hold exactly what the
proxy captured (tokens, loss mask, logprobs) and the verifier's rewards; the trials must be handed to the runner."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runctl.events import TrialFinished
from runctl.layout import TRAJECTORY, TRIAL_RECORD, trial_folder
from runctl.tasks import load_index
from services.launcher.engines.verl.host import TrialHost
from services.launcher.engines.verl.outbox import OutboxReader
from services.launcher.engines.verl.prepare import prepare
from tests.conftest import NatsServer
from tests.infra.fake_vllm import FakeVLLM
from tests.verl.conftest import EXAMPLE_TASKS, composed, verl_train_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
    ),
]


class ServerManagerNotUsed:
    """verl's token-level server client: runctl's loop talks to the servers through the proxy instead."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise AssertionError("runctl's agent loop must reach the policy through the proxy")


@pytest.fixture
async def upstream() -> AsyncIterator[FakeVLLM]:
    # Every tool call the stand-in server makes runs this command: say-yes passes, the other tasks do not.
    server = FakeVLLM(tool_arguments=json.dumps({"command": "echo yes > /app/answer.txt"}))
    await server.start()
    yield server
    await server.close()
    await TrialHost.close_all()


async def test_verl_trains_on_exactly_what_the_proxy_captured_and_the_verifiers_rewards(
    tmp_path: Path, upstream: FakeVLLM
) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    config = verl_train_config()
    tasks, errors = load_index(EXAMPLE_TASKS).load_tasks()
    assert not errors
    run_dir = tmp_path / "run"
    prepare(config, run_dir, tasks, [])
    verl_config = composed(config, run_dir)
    # The stand-in server, instead of discovering verl's vllm_server_* actors (no Ray here).
    registry = run_dir / "verl" / "agent_loops.yaml"
    registry.write_text(registry.read_text() + f"  upstreams: [{upstream.url}]\n")

    manager = ServerManagerNotUsed()
    worker = AgentLoopWorker(verl_config, manager)
    dataset = RLHFDataset([str(run_dir / "verl" / "train.parquet")], worker.tokenizer, verl_config.data)
    assert len(dataset) == len(tasks)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch = batch.repeat(repeat_times=config.n_resp, interleave=True)  # as verl's trainer does before a rollout
    out = await worker.generate_sequences(batch)

    assert manager.calls == 0
    samples = len(tasks) * config.n_resp
    assert out.batch["responses"].shape[0] == samples
    seen = set()
    for i in range(samples):
        task, number = out.non_tensor_batch["runctl_trial"][i].rsplit("/", 1)
        folder = trial_folder(run_dir / "trials", task, int(number))
        record = json.loads((folder / TRIAL_RECORD).read_text())
        (sequence,) = json.loads((folder / TRAJECTORY).read_text())["sequences"]
        n = len(sequence["response_token_ids"])
        assert out.batch["responses"][i][:n].tolist() == sequence["response_token_ids"]
        assert out.batch["response_mask"][i].tolist() == sequence["response_mask"] + [0] * (config.max_resp - n)
        assert out.batch["rollout_log_probs"][i][:n].tolist() == pytest.approx(sequence["response_logprobs"])
        prompt = sequence["prompt_token_ids"]
        assert out.batch["prompts"][i][-len(prompt) :].tolist() == prompt
        # verl's reward stage is skipped: the verifier's reward sits on the last response token.
        assert out.batch["rm_scores"][i][n - 1].item() == record["reward"]
        assert out.batch["rm_scores"][i].sum().item() == record["reward"]
        assert record["reward"] == (1.0 if task.endswith("say-yes") else 0.0)
        assert 0 in sequence["response_mask"] and 1 in sequence["response_mask"]  # a tool's output was masked out
        seen.add((task, int(number)))
    assert seen == {(t.id, k) for t in tasks for k in range(config.n_resp)}

    handed = OutboxReader(run_dir).pending()
    assert sorted(key for _, key, _ in handed) == sorted(f"trial.{t}.{k}" for t, k in seen)
    for _, _, payload in handed:
        assert isinstance(payload, TrialFinished)
        assert payload.reward == (1.0 if payload.task.endswith("say-yes") else 0.0)


async def test_the_loop_finds_verls_servers_as_their_ray_actors(
    tmp_path: Path, upstream: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As inside verl: no server URL is given; the proxy finds the vllm_server_* actor (here a stand-in that names the
    # stand-in server, made by a driver as verl's trainer makes its servers).
    import ray
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from tests.infra import ray_head

    if ray_head.why_unavailable():
        pytest.skip(str(ray_head.why_unavailable()))
    config = verl_train_config(TRAIN_BSZ=1, TRAIN_MINI_BSZ=1, N_RESP=1)
    (task,) = [t for t in load_index(EXAMPLE_TASKS).load_tasks()[0] if t.id.endswith("say-yes")]
    run_dir = tmp_path / "run"
    prepare(config, run_dir, [task], [])
    with ray_head.ray_head() as head:
        ray_head.start_server_actor(head, upstream.server.port, namespace="runctl-verl-r1")
        ray_head.start_server_actor(head, 9, namespace="runctl-verl-another-run")  # not this run's: never routed to
        monkeypatch.setenv("RAY_ADDRESS", head.gcs_address)
        # This process stands for an agent-loop worker of verl's job, which runs in the job's namespace.
        ray.init(address=head.gcs_address, namespace="runctl-verl-r1", log_to_driver=False)
        try:
            verl_config = composed(config, run_dir)
            worker = AgentLoopWorker(verl_config, ServerManagerNotUsed())
            dataset = RLHFDataset([str(run_dir / "verl" / "train.parquet")], worker.tokenizer, verl_config.data)
            out = await worker.generate_sequences(DataProto.from_single_dict(collate_fn([dataset[0]])))
            (host,) = TrialHost._hosts.values()
            assert host.proxy is not None
            routed = sorted(host.proxy.pool.replicas)
        finally:
            await TrialHost.close_all()
            ray.shutdown()
    assert routed == ["runctl-verl-r1/vllm_server_0_0"]  # the run's own server, not the other run's
    assert out.batch["rm_scores"].sum().item() == 1.0
    assert out.non_tensor_batch["runctl_trial"][0].endswith("say-yes/0")
    # The weight versions the trajectory spans, read from verl's servers (its fully async trainer counts them).
    assert out.non_tensor_batch["min_global_steps"][0] == 4 == out.non_tensor_batch["max_global_steps"][0]


async def test_a_workers_sandboxes_are_booked_in_the_ledger_with_the_bus_the_runner_hands_it(
    tmp_path: Path, upstream: FakeVLLM, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from runctl.bus import Bus
    from runctl.events.payloads import TRIALS_STREAM
    from runctl.subjects import team_stream
    from runctl.verl import driver_env, verl_overrides
    from runctl.verl import runtime_env_hook as hook
    from services.launcher.engines.verl.engine import WORKER_ENV
    from services.sandbox.ledger import SandboxLedger
    from services.validator.checks.verl_schema import verl_config_dir

    config = verl_train_config(TRAIN_BSZ=1, TRAIN_MINI_BSZ=1, N_RESP=1)
    (task,) = [t for t in load_index(EXAMPLE_TASKS).load_tasks()[0] if t.id.endswith("say-yes")]
    run_dir = tmp_path / "run"
    prepare(config, run_dir, [task], [], run_id="r-verl")
    # The runner hands the bus (and the replicas' key) to verl's driver, whose runtime-environment hook gives them to
    # every actor of verl's (tests/verl/test_worker_env.py runs that through verl's own run_ppo).
    runner_env = {"RUNCTL_NATS_URL": nats_server.url, "RUNCTL_HOME": str(tmp_path / "home"), "PATH": "/bin",
                  "VLLM_API_KEY": "the-runs-replica-key"}  # fmt: skip
    driver = driver_env(runner_env, [*WORKER_ENV, "VLLM_API_KEY"])
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        overrides = verl_overrides(config, str(run_dir))
        verl_config = compose("ppo_trainer", overrides=overrides)
    for name in ("RAY_RUNTIME_ENV_HOOK", "RUNCTL_VERL_WORKER_ENV", "RUNCTL_NATS_URL", "RUNCTL_HOME", "VLLM_API_KEY"):
        monkeypatch.setenv(name, driver[name])  # the driver's environment, and (after the hook) the worker's
    workers_env = hook(OmegaConf.to_container(verl_config.ray_kwargs.ray_init.runtime_env))["env_vars"]  # type: ignore[arg-type]
    assert workers_env["RUNCTL_NATS_URL"] == nats_server.url and "PATH" not in workers_env
    assert workers_env["VLLM_API_KEY"] == "the-runs-replica-key"
    assert not any(nats_server.url in o or "the-runs-replica-key" in o for o in overrides)  # never on a command line

    bus = await Bus.connect(nats_server.url)
    try:
        await bus.ensure_streams()
        ledger = await SandboxLedger.open(bus)
        host = await TrialHost.get(run_dir, [upstream.url])
        assert host.proxy is not None and host.proxy.pool.key == "the-runs-replica-key"  # it calls verl's servers
        (owner,) = [o for o in await ledger.live_owners(60) if o.startswith("runner-")]  # the worker heart-beats
        outcome = await host.run_trial(str(task.path))
        assert outcome.record["reward"] == 1.0
        await TrialHost.close_all()
        assert owner not in await ledger.live_owners(60) and await ledger.entries() == {}
        info = await bus.js.stream_info(
            team_stream(TRIALS_STREAM, "default"), subjects_filter="runctl.default.r-verl.>"
        )
        assert info.state.subjects == {
            "runctl.default.r-verl.sandbox.created": 1,
            "runctl.default.r-verl.sandbox.destroyed": 1,
        }
    finally:
        await bus.close()
