"""Expected errors reach the user as one red ``ErrorType: message`` line, exit code 1, and no Python traceback: in
`runctl run`'s output, in the run's events, and in the services' logs. A run that fails in a phase ends as
``run.failed`` with the phase, the error type, the message and the fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runctl.config import load_config
from runctl.events import Event, RunFailed
from tests.conftest import ROOT, Services, wait_until
from tests.infra import ray_head as ray_infra
from tests.integration.test_lifecycle import start_core, submit, wait_for_state

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
RUNCTL = str(BIN / "runctl")
DATA = ROOT / "tests" / "data"
NEEDS_RAY = pytest.mark.skipif(bool(ray_infra.why_unavailable()), reason=str(ray_infra.why_unavailable()))


def eval_config(tmp_path: Path, **values: str) -> Path:
    """An ENGINE=local eval of the oracle on the `hello` task, with a model folder of its own (config.json only:
    enough to validate, and nothing is served before the failure under test)."""
    model = tmp_path / "model"
    if not model.exists():
        model.mkdir()
        shutil.copy(DATA / "models" / "llama-tiny" / "config.json", model)
    tasks = tmp_path / "tasks"
    if not tasks.exists():
        shutil.copytree(DATA / "tasks" / "hello", tasks / "hello")
    settings = {
        "RUN_TYPE": "eval",
        "TEAM": "demo",
        "PROJECT_NAME": "errors",
        "EXP_NAME": "errors",
        "MODEL_PATH": str(model),
        "DATASET_PATH": str(tasks),
        "NGPUS_PER_NODE": "0",
        "GEN_TP": "1",
        "MAX_MODEL_LEN": "512",
        **values,
    }
    path = tmp_path / "run.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


def run_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNCTL_", "RAY_AUTH", "DOCKER_HOST"))}
    (home / "user").mkdir(parents=True, exist_ok=True)
    return {**env, "RUNCTL_HOME": str(home), "HOME": str(home / "user"), **extra}


def assert_one_error(result: subprocess.CompletedProcess[str], error_type: str, text: str) -> None:
    """Exit 1, exactly one ``ErrorType: message`` line naming ``text``, and no traceback on either stream."""
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    lines = [line for line in out.splitlines() if line.startswith(f"{error_type}: ")]
    assert len(lines) == 1, out
    assert text in lines[0], lines[0]
    assert "Fix:" in out
    assert "Traceback" not in out


def events_of(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_without_bubblewrap_the_run_stops_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = run_env(home, PATH=str(BIN))  # runctl's own environment, and no bwrap on the PATH
    result = subprocess.run([RUNCTL, "run", str(eval_config(tmp_path))], env=env, capture_output=True, text=True)
    assert_one_error(result, "ChecksFailedError", "sandbox.local: bubblewrap (bwrap) is not installed here")
    assert "apt-get install bubblewrap" in result.stdout + result.stderr
    assert not (home / "runs").exists()  # nothing was launched


def test_a_docker_daemon_that_does_not_answer_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    gone = f"unix://{tmp_path}/no-docker.sock"
    cfg = eval_config(tmp_path, BACKEND="docker", IMAGE_BUILD="1", DOCKER_HOST=gone)
    result = subprocess.run([RUNCTL, "run", str(cfg)], env=run_env(tmp_path / "home"), capture_output=True, text=True)
    assert_one_error(result, "ChecksFailedError", f"sandbox.docker: the Docker daemon at {gone} does not answer")


def test_a_malformed_task_toml_stops_the_run_naming_the_file(tmp_path: Path) -> None:
    cfg = eval_config(tmp_path)
    (tmp_path / "tasks" / "hello" / "task.toml").write_text("[agent\ntimeout_sec = 60\n")
    result = subprocess.run([RUNCTL, "run", str(cfg)], env=run_env(tmp_path / "home"), capture_output=True, text=True)
    assert_one_error(result, "ChecksFailedError", "paths.task_layout")
    assert "hello/task.toml: is not valid TOML" in result.stdout + result.stderr


@pytest.mark.parametrize("broken", ["bubblewrap", "task.toml"])
async def test_the_runner_ends_the_run_as_failed_in_the_phase_it_was_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """The same errors met by the runner itself (a submitted run: the validator service checks statically, on
    another machine perhaps): the run ends as run.failed with the phase, the type, the message and the fix."""
    from services.launcher.carry.foreground import run_foreground

    monkeypatch.setenv("RUNCTL_HOME", str(tmp_path / "home"))
    config = load_config(eval_config(tmp_path), environ={}).model
    if broken == "bubblewrap":
        monkeypatch.setenv("PATH", str(BIN))
    else:
        (tmp_path / "tasks" / "hello" / "task.toml").write_text("version = 1.0\n[agent]\ntimeout_sec = -1\n")
    seen: list[Event] = []
    end, run_dir = await run_foreground(config, "runner-refuses", seen.append)
    assert isinstance(end.data, RunFailed)
    assert end.data.phase == "validate" and end.data.error_type == "EngineError"
    assert ("sandbox.local" if broken == "bubblewrap" else "paths.task_layout") in end.data.message
    assert end.data.fix and end.data.fix in end.data.message
    assert "Traceback" not in (run_dir / "events.jsonl").read_text()


@NEEDS_RAY
@pytest.mark.timeout(600)  # waits of up to 120 + 240 s
def test_a_model_folder_deleted_after_validation_fails_the_run_in_the_replicas_phase(tmp_path: Path) -> None:
    cfg = eval_config(tmp_path, AGENT_NAME="terminal")
    home = tmp_path / "home"
    run_dir = home / "runs" / "demo" / "model-gone"
    proc = subprocess.Popen(
        [RUNCTL, "run", str(cfg), "--run-id", "model-gone"],
        env=run_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Validated and started: the runner is bringing up Ray. Now the model goes.
        wait_until(lambda: any(e["data"].get("phase") == "ray" for e in events_of(run_dir)), 120, "the ray phase", 0.05)
        shutil.rmtree(tmp_path / "model")
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert_one_error(result, "EngineError", f"MODEL_PATH {tmp_path / 'model'} is gone")
    end = events_of(run_dir)[-1]
    assert end["type"] == "runctl.run.failed.v1" and end["data"]["phase"] == "replicas"
    assert end["data"]["error_type"] == "EngineError" and "--run-id" in end["data"]["fix"]
    assert "Traceback" not in (run_dir / "events.jsonl").read_text()


def test_a_failed_run_and_a_rejected_one_leave_no_traceback_in_any_service_log(
    services: Services, tmp_path: Path
) -> None:
    from tests.integration.test_lifecycle import fake_config

    start_core(services)
    failed = submit(services, fake_config(tmp_path, FAKE_FAIL_AT="replicas"))
    rejected = submit(services, eval_config(tmp_path, SCAFFOLD="oh", AGENT_NAME="openhands"))
    wait_for_state(services, failed, "failed")
    record = wait_for_state(services, rejected, "rejected")
    assert any(
        "full OpenHands (oh) runs its own runtime containers" in c["message"] for c in record["run"]["error"]["checks"]
    )
    for name in ("validator", "launcher", "tracker"):
        assert "Traceback" not in services.log(name), name


def test_the_cli_prints_a_runctl_error_as_one_line_from_its_one_catch_site(tmp_path: Path) -> None:
    env = run_env(tmp_path / "home", RUNCTL_NATS_URL="nats://runctl:s3cret-pass@127.0.0.1:1")
    result = subprocess.run([RUNCTL, "watch", "some-run"], env=env, capture_output=True, text=True, timeout=60)
    assert_one_error(result, "BusUnreachableError", "cannot reach the runctl bus at nats://runctl:***@127.0.0.1:1")
    assert "s3cret-pass" not in result.stdout + result.stderr  # the services' password is never printed

    not_a_task = [RUNCTL, "task", "run", str(tmp_path), "--agent", "oracle", "--backend", "local"]
    result = subprocess.run(not_a_task, env=env, capture_output=True, text=True, timeout=60)
    assert_one_error(result, "TaskError", "has no task.toml")

    no_such_agent = [RUNCTL, "task", "run", str(DATA / "tasks" / "hello"), "--agent", "nobody", "--backend", "local"]
    result = subprocess.run(no_such_agent, env=env, capture_output=True, text=True, timeout=60)
    assert_one_error(result, "SandboxError", "no built-in agent 'nobody'")
