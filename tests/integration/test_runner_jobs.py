"""Submitted ENGINE=local runs are carried as Ray jobs: the launcher starts a Ray head of its own (inside the
loopback-only namespace), submits the runner through the Jobs API, watches it, and cancels it with `ray job stop`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from runctl.sdk import RunctlClient, submitter
from tests.conftest import ROOT, Services, wait_until
from tests.infra import ray_head as ray_infra
from tests.integration.test_lifecycle import start_core, submit, tracked, wait_for_state

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(ray_infra.why_unavailable() or shutil.which("bwrap") is None),
        reason=str(ray_infra.why_unavailable() or "bubblewrap is not installed"),
    ),
]


def oracle_eval(tmp_path: Path, n_trials: int, **extra: str) -> Path:
    tasks = tmp_path / "tasks"
    for name in ("hello", "failing"):
        shutil.copytree(ROOT / "tests" / "data" / "tasks" / name, tasks / name)
    config = tmp_path / "eval.env"
    values = {
        "RUN_TYPE": "eval",
        "ENGINE": "local",
        "TEAM": "nlp",
        "PROJECT_NAME": "p",
        "EXP_NAME": "jobs",
        "MODEL_PATH": str(ROOT / "tests" / "data" / "models" / "llama-tiny"),
        "NGPUS_PER_NODE": "0",
        "GEN_TP": "1",
        "AGENT_NAME": "oracle",
        "DATASET_PATH": str(tasks),
        "N_TRIALS": str(n_trials),
        "N_CONCURRENT": "1",
        **extra,
    }
    config.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return config


def wait_for_end(services: Services, run_id: str, state: str) -> dict[str, Any]:
    """The run's record once it ended in ``state`` with all its trials recorded (the tracker consumes trials from
    their own stream, so the end may be recorded a moment before the last of them)."""
    record: dict[str, Any] = {}

    def ended() -> bool:
        nonlocal record
        record = wait_for_state(services, run_id, state, timeout_s=240)
        trials = sum(e["name"] == "trial.finished" for e in record["events"])
        return bool(
            trials == record["events"][-1]["data"]["num_trials"] or record["events"][-1]["name"] != "run." + state
        )

    wait_until(ended, 60, f"every trial of {run_id} to be recorded", interval_s=0.2)
    return record


def jobs_of(services: Services, run_id: str) -> list[Any]:
    from ray.job_submission import JobSubmissionClient

    head = json.loads((services.home / "owned" / "ray-head.json").read_text())
    client = JobSubmissionClient(head["extra"]["url"], headers={"Authorization": f"Bearer {head['extra']['token']}"})
    return [j for j in client.list_jobs() if (j.metadata or {}).get("runctl_run") == run_id]


@pytest.mark.timeout(900)  # a Ray head, a job of up to 80 trials, and waits of up to 240 s
def test_a_submitted_run_is_carried_as_a_ray_job(services: Services, tmp_path: Path) -> None:
    start_core(services)
    run_id = submit(services, oracle_eval(tmp_path, 2))
    record = wait_for_end(services, run_id, "succeeded")
    names = [e["name"] for e in record["events"]]
    assert names.index("run.admitted") < names.index("cluster.ready") < names.index("replicas.ready")
    assert names.count("run.succeeded") == 1 and names.count("trial.finished") == 4
    end = next(e["data"] for e in record["events"] if e["name"] == "run.succeeded")
    assert end["score"] == 0.5 and end["summary"]["pass@1"] == 0.5
    # The job exits just after the runner published the end.
    wait_until(lambda: job_status(services, run_id) == "SUCCEEDED", 60, "the job to succeed", interval_s=0.5)
    (job,) = jobs_of(services, run_id)
    assert job.submission_id == f"{run_id}.attempt1" and job.metadata["runctl_team"] == "nlp"
    head = json.loads((services.home / "owned" / "ray-head.json").read_text())
    run_dir = services.home / "runs" / "nlp" / run_id
    assert (run_dir / "summary.csv").exists() and len(list(run_dir.glob("trials/*/trial-*/trial.json"))) == 4

    # The launcher stops the Ray head it started when it stops.
    services.stop("launcher")
    assert not (services.home / "owned" / "ray-head.json").exists()
    wait_until(lambda: not _alive(head["pid"]), 30, "the launcher's Ray head to stop")


def job_status(services: Services, run_id: str) -> str:
    (job,) = jobs_of(services, run_id)
    return str(job.status.value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(900)  # a Ray head, a job of up to 80 trials, and waits of up to 240 s
def test_cancelling_a_job_run_stops_its_job_and_names_who_asked(services: Services, tmp_path: Path) -> None:
    start_core(services)
    run_id = submit(services, oracle_eval(tmp_path, 40))

    def some_trials() -> bool:
        record = tracked(services, run_id)
        return bool(record and any(e["name"] == "trial.finished" for e in record["events"]))

    wait_until(some_trials, 240, "the first trial", interval_s=0.5)

    async def cancel() -> None:
        async with RunctlClient(services.nats_url, services.tracker_url) as client:
            await client.cancel(run_id, reason="enough")

    asyncio.run(cancel())
    record = wait_for_end(services, run_id, "cancelled")
    (end,) = [e for e in record["events"] if e["name"] == "run.cancelled"]
    assert end["data"]["requested_by"] == submitter()
    assert end["data"]["phase"] == "loop"
    assert 1 <= end["data"]["num_trials"] < 80
    wait_until(lambda: job_status(services, run_id) == "STOPPED", 60, "the job to stop", interval_s=0.5)


@pytest.mark.timeout(900)  # a Ray head, a job of up to 80 trials, and waits of up to 240 s
def test_a_run_outlives_its_launcher_and_resumes_on_the_next_one(services: Services, tmp_path: Path) -> None:
    start_core(services)
    run_id = submit(services, oracle_eval(tmp_path, 40))

    def some_trials() -> bool:
        record = tracked(services, run_id)
        return bool(record and sum(e["name"] == "trial.finished" for e in record["events"]) >= 2)

    wait_until(some_trials, 240, "two trials", interval_s=0.5)
    services.stop("launcher")  # its Ray head, and the job on it, go with it; the run stays active
    services.start("launcher")
    record = wait_for_end(services, run_id, "succeeded")
    finished = [(e["data"]["task"], e["data"]["trial"]) for e in record["events"] if e["name"] == "trial.finished"]
    assert sorted(finished) == sorted((t, k) for t in ("hello", "failing") for k in range(40))
    end = next(e["data"] for e in record["events"] if e["name"] == "run.succeeded")
    assert end["num_trials"] == 80 and end["summary"]["pass@1"] == 0.5
    assert [j.submission_id for j in jobs_of(services, run_id)] == [f"{run_id}.attempt2"]


def runner_drivers(run_id: str) -> list[int]:
    """The PIDs of the run's runner processes (the Ray job's driver: ``python -m services.launcher.carry.job_main``)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"services.launcher.carry.job_main" in argv and run_id.encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def recorded_trials(services: Services, run_id: str) -> int:
    record = tracked(services, run_id)
    return sum(e["name"] == "trial.finished" for e in record["events"]) if record else 0


def kill_the_runner_after(services: Services, run_id: str, trials: int) -> int:
    """SIGKILL the run's runner once ``trials`` trials are recorded (the runner dies; its job, and nothing else,
    goes with it); returns how many trials it had recorded by then."""
    wait_until(lambda: recorded_trials(services, run_id) >= trials, 240, f"{trials} trials", interval_s=0.5)
    drivers: list[int] = []

    def one_runner() -> bool:
        # One look at /proc, used for the kill too: a look taken while the runner forks a process (which bears its
        # command line until it execs) sees two.
        drivers[:] = runner_drivers(run_id)
        return len(drivers) == 1

    wait_until(one_runner, 120, "the run's runner")
    os.kill(drivers[0], signal.SIGKILL)
    return recorded_trials(services, run_id)


@pytest.mark.timeout(900)  # a Ray head, two runners of one job each, and waits of up to 240 s
def test_a_runner_that_dies_is_started_again_up_to_max_retries_then_the_run_fails_saying_how_often(
    services: Services, tmp_path: Path
) -> None:
    start_core(services)
    run_id = submit(services, oracle_eval(tmp_path, 12, MAX_RETRIES="1"))
    first = kill_the_runner_after(services, run_id, 2)
    # The launcher starts a second runner: it resumes where the first stopped (more trials come, none again)...
    kill_the_runner_after(services, run_id, first + 1)
    # ...and when that one dies too, MAX_RETRIES=1 is spent: the run fails, saying how many runners it had.
    record = wait_for_end(services, run_id, "failed")
    error = record["run"]["error"]
    assert error["phase"] == "loop" and error["error_type"] == "LauncherError"
    assert (
        "the run's runner died 2 time(s) without ending the run (MAX_RETRIES=1: 2 attempt(s) in all)"
        in (error["message"])
    )
    assert error["fix"]
    end = next(e["data"] for e in record["events"] if e["name"] == "run.failed")
    assert end["attempts"] == 2 and end["num_trials"] > first
    finished = [(e["data"]["task"], e["data"]["trial"]) for e in record["events"] if e["name"] == "trial.finished"]
    assert len(finished) == len(set(finished)) > first  # the second runner redid none of the first one's trials
    assert sorted(j.submission_id for j in jobs_of(services, run_id)) == [f"{run_id}.attempt1", f"{run_id}.attempt2"]
