"""Every command the README shows is run here, as written."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from runctl.config import TrainConfig, load_config
from runctl.events import CheckpointSaved, new_event
from runctl.home import read_stack_state
from runctl.ports import free_ports
from services.launcher.evalstore import eval_run_id
from tests.conftest import ROOT, SANDBOX_CGROUP, admin_headers
from tests.e2e.conftest import UP_ENV, Cli, admin_bus_url
from tests.infra.vllm_server import VLLMServer

README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def commands(block: str) -> list[str]:
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def env_for(home: Path) -> dict[str, str]:
    # No runctl setting of the test process, but its worker's cgroup parent of local sandboxes (tests/conftest.py).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNCTL_") or k == SANDBOX_CGROUP}
    nats_port, tracker_port = free_ports(2)
    env |= {
        "RUNCTL_HOME": str(home),
        "RUNCTL_NATS_PORT": str(nats_port),
        "RUNCTL_TRACKER_PORT": str(tracker_port),
        "PATH": f"{BIN}:{env.get('PATH', '')}",
    }
    env |= UP_ENV
    return env


def run(line: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``line`` in bash, in a process group of its own: whatever it started is stopped with it when it runs past
    ``timeout`` or the test is interrupted (a CLI left behind would wait on a stack that is gone)."""
    proc = subprocess.Popen(
        ["bash", "-c", line],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_quick_start_names_exactly_the_two_commands() -> None:
    assert commands(blocks("bash")[0]) == ["./scripts/demo.sh", "./scripts/test.sh"]


CHECKPOINT_LINE = re.compile(
    r"^  (base model|step (\d+)) +pass@1 ([\d.]+) \[([\d.]+), ([\d.]+)\] \((\d+) trials\).*eval run (\S+)$", re.M
)


def _vllm_or_skip() -> None:
    from tests.infra import vllm_server

    reason = vllm_server.why_unavailable()
    if reason:
        pytest.skip(reason)
    vllm_server.tiny_model()  # made once for the suite, in the folder the examples name


@pytest.mark.vllm
@pytest.mark.timeout(1000)  # the demo's own limit is 900 s
# Memory: a train run's replica and trainer beside up to two eval runs' replicas (about 10 GiB at its peak), while
# each worker also holds its served_model replica: beside another such test it would not fit in 24 GiB.
@pytest.mark.exclusive("a train run with its eval runs: about 10 GiB at its peak")
def test_the_demo_trains_on_cpu_and_every_checkpoint_beats_nothing_by_luck(tmp_path: Path) -> None:
    # The one test that walks the whole path on a stack, for real: an infer run, a train run (TRL's GRPO, the
    # replica reloading each step's weights, checkpoints in Hugging Face format) and an eval run of every checkpoint,
    # linked in the tracker. The other real runs check only what they add: the foreground infer and eval commands
    # (test_the_infer_and_eval_block_runs_as_written), a killed train run's resume (tests/integration/test_train.py).
    _vllm_or_skip()
    home = tmp_path / "home"
    env = env_for(home)
    try:
        result = run("./scripts/demo.sh", ROOT, env, timeout=900)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        # It ends with the dashboard's URL, where the tracker has every run.
        url = result.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), result.stdout[-2000:]
        recorded = {kind: run(f"runctl runs --type {kind}", ROOT, env).stdout for kind in ("infer", "train", "eval")}
        train_run = re.search(r"train run (\S+): pass@1 on its training tasks", result.stdout).group(1)  # type: ignore[union-attr]
        stack = Cli(home, env)
        linked = checkpoints_linked(stack, train_run)
        republished = republish_a_checkpoint(stack, train_run, step=linked[1]["step"])
        train_events = json.loads(stack("show", train_run, "--json").stdout)["events"]
        train_trials = tracker_get(stack, f"/api/runs/{train_run}/trials?limit=500")["trials"]
    finally:
        run("runctl down", ROOT, env)
    out = result.stdout
    assert "Traceback" not in out + result.stderr
    assert recorded["infer"].count("succeeded") == 1 and recorded["train"].count("succeeded") == 1
    report = out[out.index("pass@1 on its training tasks") :]
    rows = CHECKPOINT_LINE.findall(report)
    # base model + checkpoints on the training tasks, then base model and the last checkpoint on the held-out ones
    train_rows, held = rows[:-2], rows[-2:]
    steps = [int(r[1] or 0) for r in train_rows]
    assert steps[0] == 0 and steps == sorted(steps) and len(steps) >= 3, report
    assert recorded["eval"].count("succeeded") == len(rows), recorded["eval"]
    for row in rows:
        assert row[6] in recorded["eval"]
    base, last = (tuple(float(x) for x in r[2:5]) for r in (train_rows[0], train_rows[-1]))
    assert last[0] - base[0] >= 0.3, report  # RL taught it something
    assert last[1] > base[2], report  # and the 95 % intervals are apart: not luck
    assert [r[0] for r in held] == ["base model", f"step {steps[-1]}"], report
    assert all(int(r[5]) >= 32 for r in rows)

    # The tracker links each checkpoint (the base model is step 0) to its eval run, which names the train run and
    # the step it scored, and to its score.
    assert [row["step"] for row in linked] == steps
    for row in linked:
        assert row["eval_run_id"] == eval_run_id(train_run, row["step"]) and row["eval_state"] == "succeeded"
        assert row["eval_score"] is not None and row["parent"] == (train_run, str(row["step"]))
    # checkpoint.saved of a step published once more, as a new event: still one eval run, one eval.requested each.
    assert republished == (1, steps)
    train_config = load_config(home / "demo" / "train-cpu.env").model
    assert isinstance(train_config, TrainConfig)
    per_step = train_config.train_bsz * train_config.n_resp
    assert_a_real_train_run(home / "runs" / "demo" / train_run, train_events, train_trials, steps, per_step)


def tracker_get(stack: Cli, path: str) -> Any:
    """``path`` of the stack's tracker API, as its admin."""
    import httpx

    state = read_stack_state(stack.home)
    assert state is not None
    token = (stack.home / "admin-token").read_text().strip()  # the embedded stack's tracker wrote it
    return httpx.get(f"{state.tracker_url}{path}", headers=admin_headers(token), timeout=30).json()


def checkpoints_linked(stack: Cli, train_run: str) -> list[dict[str, Any]]:
    """The tracker's checkpoints of ``train_run``, each with the PARENT_RUN and CHECKPOINT_STEP its eval run was
    submitted with (``parent``)."""
    rows: list[dict[str, Any]] = tracker_get(stack, f"/api/runs/{train_run}/checkpoints")["checkpoints"]
    for row in rows:
        (submission,) = events_named(stack, row["eval_run_id"], "config.submitted")
        values = {k: v["value"] for k, v in submission["data"]["resolved"].items()}
        row["parent"] = (values["PARENT_RUN"], values["CHECKPOINT_STEP"])
    return rows


def republish_a_checkpoint(stack: Cli, train_run: str, step: int) -> tuple[int, list[int]]:
    """Publish ``train_run``'s checkpoint.saved of ``step`` again as a new event, wait until the launcher took it;
    the eval run's submissions then, and the steps of the train run's eval.requested."""
    first = next(e["data"] for e in events_named(stack, train_run, "checkpoint.saved") if e["data"]["step"] == step)
    again = new_event(
        CheckpointSaved(**first), team="demo", run_id=train_run, source="/test", event_id=f"{train_run}.ckpt.again"
    )
    asyncio.run(republish_and_drain(admin_bus_url(stack.home), again))
    submissions = len(events_named(stack, eval_run_id(train_run, step), "config.submitted"))
    return submissions, sorted(e["data"]["checkpoint_step"] for e in events_named(stack, train_run, "eval.requested"))


def events_named(stack: Cli, run_id: str, name: str) -> list[dict[str, Any]]:
    shown = json.loads(stack("show", run_id, "--json").stdout)
    return [e for e in shown["events"] if e["name"] == name]


async def republish_and_drain(nats_url: str, event: Any) -> None:
    """Publish ``event`` and wait until the launcher's consumer has acknowledged everything it was given."""
    from runctl.bus import Bus
    from runctl.events.payloads import RUNS_STREAM
    from runctl.subjects import team_stream

    bus = await Bus.connect(nats_url)
    try:
        await bus.publish(event)
        for _ in range(600):
            info = await bus.js.consumer_info(team_stream(RUNS_STREAM, event.team), "launcher")
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the launcher did not take the event within 60 s")
    finally:
        await bus.close()


def assert_a_real_train_run(
    run_dir: Path, events: list[dict[str, Any]], trials: list[dict[str, Any]], steps: list[int], per_step: int
) -> None:
    """The demo's train run was carried for real: every step with TRL's metrics, a policy that moved, checkpoints in
    Hugging Face format that load, every trial numbered once (``events`` and ``trials`` as the tracker has them)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    published = [e for e in events if e["name"] == "step.done"]
    metrics = {e["data"]["step"]: e["data"]["metrics"] for e in published}
    assert sorted(metrics) == list(range(1, steps[-1] + 1)) and len(published) == len(metrics)
    assert all(e["data"]["synthetic"] is False for e in published)
    for step, values in metrics.items():
        for key in ("critic/score/mean", "critic/rewards/mean", "actor/pg_loss", "actor/ppo_kl", "actor/entropy",
                    "actor/grad_norm", "actor/lr", "response_length/mean", "timing_s/gen", "timing_s/update_actor",
                    "timing_s/sync_weights", "timing_s/step", "traj_filter/timeout"):  # fmt: skip
            assert key in values, (step, key)
        assert values["actor/grad_norm"] >= 0 and values["response_length/mean"] > 0
        if 0 < values["critic/score/mean"] < 1:  # rewards differ within the group: the advantages are not all 0
            assert values["actor/grad_norm"] > 0, step
    saved = [e["data"] for e in events if e["name"] == "checkpoint.saved"]
    assert sorted({d["step"] for d in saved}) == steps[1:]
    last = max(saved, key=lambda d: d["step"])
    hf = Path(last["path"])
    assert hf == run_dir / "checkpoints" / f"global_step_{steps[-1]}" / "huggingface"
    base = load_file(vllm_tiny_model() / "model.safetensors")
    assert last["format"] == "hf" and last["num_bytes"] > sum(v.numel() * 4 for v in base.values())
    AutoModelForCausalLM.from_pretrained(hf)
    assert AutoTokenizer.from_pretrained(hf).chat_template
    moved = load_file(hf / "model.safetensors")
    assert any(not moved[k].equal(base[k]) for k in base)
    # Every trial of the run has its own number: step s numbers its N_RESP trials from (s - 1) × N_RESP.
    assert sorted(t["trial"] for t in trials) == list(range(steps[-1] * per_step))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps[-1] and summary["last_checkpoint"] == last["path"]


def vllm_tiny_model() -> Path:
    from tests.infra import vllm_server

    return vllm_server.tiny_model()


def test_the_train_block_is_what_the_demo_runs() -> None:
    lines = commands(blocks("bash")[4])
    assert lines == ["runctl up", "runctl demo --cpu"]
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    assert demo.rstrip().endswith("\n".join(f".venv/bin/{line}" for line in lines))


def test_the_gpu_block_runs_as_written_and_says_what_a_cpu_machine_lacks(tmp_path: Path) -> None:
    lines = commands(blocks("bash")[5])
    assert lines == ["./scripts/gpu_smoke.sh", "runctl validate --dry-run configs/examples/train-gpu.env"]
    env = env_for(tmp_path / "home")
    if (Path("/proc/driver/nvidia/gpus")).is_dir():
        pytest.skip("this machine has an NVIDIA GPU: the smoke check would run for real (run it by hand)")
    had_gpu_set = (ROOT / ".venv-gpu").exists()
    smoke = run(lines[0], ROOT, env, timeout=60)
    assert smoke.returncode == 1 and smoke.stdout == ""
    assert smoke.stderr.count("\n") == 1 and "needs an NVIDIA GPU" in smoke.stderr and "Fix:" in smoke.stderr
    assert (ROOT / ".venv-gpu").exists() == had_gpu_set  # it stopped before installing anything

    dry = run(lines[1], ROOT, env, timeout=120)
    assert "Traceback" not in dry.stdout + dry.stderr
    fatal = [line for line in dry.stdout.splitlines() if line.startswith("✗")]
    if (ROOT / ".venv-gpu" / "bin" / "python").exists():
        assert dry.returncode in (0, 1)  # a GPU set here; no GPU, so engine.verl_runtime may refuse
    else:  # no GPU set here: the two checks that say so, and nothing else
        assert dry.returncode == 1 and [f.split()[1] for f in fatal] == ["paths.inputs", "engine.verl_runtime"]
    argv = shlex.split(dry.stdout.strip().splitlines()[-1])
    assert argv[0] == str(ROOT / ".venv-gpu" / "bin" / "python") and argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=runctl" in argv
    assert "trainer.checkpoint_callback_class=services.launcher.engines.verl.callback.CheckpointAnnouncer" in argv
    assert "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]" in argv
    assert f"actor_rollout_ref.model.path={ROOT / '.cache' / 'tinymodel'}" in argv


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_the_infer_and_eval_block_runs_as_written(tmp_path: Path) -> None:
    # The infer and eval examples in the foreground, as a user runs them; the infer run is checked in full (its
    # events, trial folders, summary and filtered index: assert_an_infer_run).
    from tests.integration.test_runner import assert_an_infer_run

    _vllm_or_skip()
    home = tmp_path / "home"
    (home / "user").mkdir(parents=True)
    env = env_for(home) | {"HOME": str(home / "user")}
    lines = commands(blocks("bash")[3])
    assert lines == ["runctl run configs/examples/infer-cpu.env", "runctl run configs/examples/eval-cpu.env"]
    outputs = []
    for line in lines:
        result = run(line, ROOT, env, timeout=300)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        outputs.append(result.stdout)
    assert "Traceback" not in "".join(outputs)
    runs = sorted((home / "runs" / "demo").iterdir())
    assert [r.name.split("-2")[0] for r in runs] == ["eval-cpu", "infer-cpu"]
    for run_dir, out in zip(runs, outputs[::-1], strict=True):
        assert f"results: {run_dir}" in out.replace("\n", "")
        assert (run_dir / "summary.csv").exists() and (run_dir / "summary.json").exists()
        assert json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])["type"].startswith(
            "runctl.run.succeeded."
        )
        for name in ("cluster.ready", "replicas.ready", "run.succeeded", "pass@1", "95% CI"):
            assert name in out
    assert "kept" in outputs[0] and "all-fail" in outputs[0]
    assert_an_infer_run(runs[1], outputs[0], home)
    # Under this HOME of their own the replicas used vLLM's cache where the suite keeps it (tests/conftest.py:
    # keep_vllms_cache), or each would have inspected the model class again in a process of its own.
    assert not (home / "user" / ".cache" / "vllm").exists()

    # The runs benchmark the README names, on this infer run (its figures are the same whether it ran the run itself
    # or reads one: `--run-dir`); 0: its overhead target met, 2: missed (the figures say by how much).
    assert "python bench/runs.py" in README
    bench = subprocess.run(
        [sys.executable, "bench/runs.py", "--run-dir", str(runs[1])], cwd=ROOT, capture_output=True, text=True
    )
    assert bench.returncode in (0, 2), bench.stdout + bench.stderr
    summary = bench.stdout.split("== summary")[1]
    assert "first_trial_s" in summary and "trials_per_minute" in summary and "overhead_share" in summary
    assert "trials: 12 (4 per task, 3 tasks), N_CONCURRENT=4" in bench.stdout


def test_the_test_command_runs_pytest_with_its_arguments() -> None:
    result = run("./scripts/test.sh tests/unit/test_state.py -q -p no:cacheprovider", ROOT, dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\d+ passed", result.stdout)


def test_the_tour_runs_line_by_line_as_written(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "configs" / "examples").mkdir(parents=True)
    shutil.copy(ROOT / "configs" / "examples" / "preview.env", work / "configs" / "examples")
    env = env_for(tmp_path / "home")
    run_id = run_dir = ""
    try:
        for line in commands(blocks("bash")[1]):
            if "RUN_ID" in line and line.startswith("runctl cancel"):
                # Cancel a second, long run rather than the finished one.
                slow = (
                    (work / "configs" / "examples" / "preview.env")
                    .read_text()
                    .replace("FAKE_NUM_STEPS=4", "FAKE_NUM_STEPS=400")
                )
                (work / "slow.env").write_text(slow)
                submitted = run("runctl submit slow.env", work, env)
                run_id = re.search(r"submitted (\S+)", submitted.stdout).group(1)  # type: ignore[union-attr]
            result = run(line.replace("RUN_ID", run_id).replace("RUN_DIR", run_dir), work, env)
            assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
            if line.startswith("runctl run "):
                run_dir = re.search(r"results: (\S+)", result.stdout).group(1)  # type: ignore[union-attr]
                assert "recorded by the tracker" in result.stdout.splitlines()[-1]
            if line.startswith("runctl tracker import"):
                assert re.search(r"published 0 of the \d+ events", result.stdout)  # the run had them on the bus
            if line.startswith("runctl submit") and "--watch" in line:
                run_id = re.search(r"submitted (\S+)", result.stdout).group(1)  # type: ignore[union-attr]
                assert "run.succeeded" in result.stdout
            if line.startswith("runctl dashboard"):
                assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", result.stdout.strip()), result.stdout
            if line.startswith("runctl tracker rebuild"):
                assert "events stored" in result.stdout and (work / "rebuilt.db").exists()
            if line.startswith("PREFLIGHT_ONLY=1"):
                assert "nothing was published" in result.stdout
        assert (work / "my_run.env").exists()
        assert read_stack_state(tmp_path / "home") is None
    finally:
        run("runctl down", work, env)


def test_the_task_commands_run_as_written(tmp_path: Path, docker_host: str) -> None:
    env = env_for(tmp_path / "home") | {"DOCKER_HOST": docker_host}
    lines = commands(blocks("bash")[2])
    assert lines and all(line.startswith("runctl task ") for line in lines)
    for line in lines:
        result = run(line, ROOT, env)
        assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
    assert '"reward": 0.0' in result.stdout  # the last one: nop on Docker, as JSON


def test_the_sdk_example_runs(tmp_path: Path) -> None:
    env = env_for(tmp_path / "home")
    try:
        assert run("runctl up", ROOT, env).returncode == 0
        script = tmp_path / "sdk_example.py"
        script.write_text(blocks("python")[0])
        result = subprocess.run(
            [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        names = [line.split()[0] for line in result.stdout.splitlines()]
        assert names[0] == "config.submitted" and names[-1] == "run.succeeded"
    finally:
        run("runctl down", ROOT, env)


@pytest.mark.parametrize("block", ["config-table", "event-catalogue", "check-table"])
def test_generated_sections_are_up_to_date(block: str) -> None:
    assert f"<!-- {block}:start -->\n|" in README
    result = subprocess.run(
        [sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_the_sandbox_benchmark_runs_and_prints_its_figures(docker_host: str) -> None:
    assert "python bench/sandbox.py" in README
    env = dict(os.environ) | {"DOCKER_HOST": docker_host}
    argv = [sys.executable, "bench/sandbox.py", "--repeat", "1", "--trials", "2"]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== summary" in result.stdout and "warm_acquire_ms" in result.stdout
    # Its sandbox service stopped its warm pool's refills before removing the pool: no warm container is left.
    import docker

    client = docker.DockerClient(base_url=docker_host)
    try:
        assert client.containers.list(all=True, filters={"label": "runctl.pool=1"}) == []
    finally:
        client.close()


@pytest.mark.parametrize(
    "argv",
    [
        ["bench/cli.py", "--repeat", "1"],
        ["bench/validate.py", "--repeat", "1"],
        ["bench/bus.py", "--rounds", "1", "--events", "300", "--rate", "200", "--duration", "1", "--warmup", "0.2"],
        ["bench/proxy.py", "--rounds", "1", "--batch", "50", "--throughput-rounds", "1", "--seconds", "1"],
        ["bench/tracker.py", "--backlog", "1500", "--rate", "500", "--duration", "1", "--steps", "300"],
        ["bench/admission.py", "--runs-per-team", "30"],
    ],
    ids=["cli", "validate", "bus", "proxy", "tracker", "admission"],
)
def test_the_benchmarks_the_readme_names_run_and_print_their_figures(argv: list[str]) -> None:
    assert f"python {argv[0]}" in README
    temp = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))  # short: sockets are made under it
    temp.chmod(0o1777)  # as /tmp: PostgreSQL's own user makes its data folder in it
    try:
        env = {**os.environ, "TMPDIR": str(temp)}
        result = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "== summary" in result.stdout
        assert "target" in result.stdout
        assert not any(temp.iterdir()), f"{argv[0]} left temporary files: {sorted(p.name for p in temp.iterdir())}"
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_the_setup_benchmark_times_a_second_demo_to_its_first_phase(tmp_path: Path) -> None:
    from tests.infra import vllm_server

    reason = vllm_server.why_unavailable()
    if reason:
        pytest.skip(reason)
    vllm_server.tiny_model()
    assert "python bench/setup.py" in README
    env = env_for(tmp_path / "home")
    try:
        result = run(f"{sys.executable} bench/setup.py --repeat 1", ROOT, env, timeout=840)
        recorded = run("runctl runs", ROOT, env).stdout
    finally:
        run("runctl down", ROOT, env)
    # Each demo was interrupted at its first phase and its infer run cancelled: none went on to a train run.
    rows = [line for line in recorded.splitlines() if "-20" in line]  # a run's row: its id has the date
    assert len(rows) >= 2 and all(" infer " in r and "cancelled" in r for r in rows), recorded
    # 0: its target met, 1: missed (the figures say by how much); a timing is reported here, not asserted.
    assert result.returncode in (0, 1), result.stdout + result.stderr
    summary = result.stdout.split("== summary")[1]
    assert "demo_first_phase_s" in summary and "run_first_phase_s" in summary and "setup_ratio" in summary
    assert ("met" if result.returncode == 0 else "MISSED") in summary


@pytest.mark.vllm
@pytest.mark.timeout(600)  # the worker's replica may start here first, then the benchmark's own 300 s
def test_the_proxy_benchmark_measures_tokens_per_second_on_vllm(served_model: VLLMServer) -> None:
    assert "python bench/proxy.py" in README and "--vllm MODEL_DIR" in README
    # The worker's replica of the tiny model: what --vllm MODEL_DIR would start is vllm_server's own command line
    # (tests/infra/vllm_server.py), so the benchmark's start of it is not what this test checks.
    argv = ["bench/proxy.py", "--rounds", "1", "--batch", "20", "--throughput-rounds", "1", "--seconds", "0.5"]
    argv += ["--vllm-url", served_model.url, "--vllm-key", served_model.key]
    argv += ["--vllm-rounds", "1", "--vllm-requests", "16", "--vllm-tokens", "16"]
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vllm_tokens_ratio" in result.stdout.split("== summary")[1]
