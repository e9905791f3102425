"""RayJobs.client from many threads at once: one local head, whatever the race; a submission while the jobs server
has no agent yet waits for one; how often the launcher asks for a job's status."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import types
from typing import Any

import pytest

from services.launcher.carry import as_job, rayjob
from services.launcher.carry.rayjob import LocalHead, RayJobs
from tests.conftest import async_wait_until


def test_concurrent_callers_share_one_local_head(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rayjob.JOBS_URL_ENV, raising=False)
    started: list[int] = []

    def start_head(self: RayJobs) -> LocalHead:
        started.append(1)
        time.sleep(0.2)  # as a real head takes seconds: every other caller arrives meanwhile
        return LocalHead(f"http://127.0.0.1:{len(started)}", 1, "/nonexistent")

    monkeypatch.setattr(RayJobs, "_start_head", start_head)
    monkeypatch.setattr(RayJobs, "_reuse_head", lambda self: None)
    fake = types.ModuleType("ray.job_submission")
    fake.JobSubmissionClient = lambda url, headers=None: ("client", url)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray.job_submission", fake)
    jobs = RayJobs()
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(jobs.client())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(started) == 1
    assert got == [("client", "http://127.0.0.1:1")] * 8


class Server:
    """A jobs server's client whose first ``refusals`` submissions are refused for want of an agent."""

    def __init__(self, refusals: int, answer: str = rayjob.NO_AGENT + ", please try again later.") -> None:
        self.refusals = refusals
        self.answer = answer
        self.submitted: list[str] = []

    def submit_job(self, submission_id: str, **_: Any) -> str:
        if len(self.submitted) < self.refusals:
            self.submitted.append("refused")
            raise RuntimeError(f"Request failed with status code 500: {self.answer}")
        self.submitted.append(submission_id)
        return submission_id


def test_a_submission_waits_for_the_jobs_servers_agent_and_fails_saying_so_when_none_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A CI run on a loaded machine: the launcher's head answered, its agent was not there yet, and the run failed at
    # once on Ray's "try again later". Now it tries again; another refusal fails the run at once, as before.
    monkeypatch.setattr(rayjob, "AGENT_RETRY_S", 0.01)
    jobs = RayJobs("http://127.0.0.1:1")
    server = Server(refusals=3)
    monkeypatch.setattr(jobs, "client", lambda: server)
    assert jobs.submit("nlp", "r1", 0, {}) == "r1.attempt0"
    assert server.submitted == ["refused"] * 3 + ["r1.attempt0"]
    monkeypatch.setattr(rayjob, "AGENT_WAIT_S", 0.1)
    never = Server(refusals=10**6)
    monkeypatch.setattr(jobs, "client", lambda: never)
    with pytest.raises(rayjob.LauncherError, match=r"refused the runner of r2 \(for 0 s\).*No available agent"):
        jobs.submit("nlp", "r2", 0, {})
    assert len(never.submitted) > 1
    other = Server(refusals=1, answer="Job with submission_id r3.attempt0 already exists.")
    monkeypatch.setattr(jobs, "client", lambda: other)
    with pytest.raises(rayjob.LauncherError, match="already exists") as refused:
        jobs.submit("nlp", "r3", 0, {})
    assert other.submitted == ["refused"] and "(for" not in str(refused.value)


class Jobs:
    """A jobs server whose job runs until ``end`` is set, then SUCCEEDED; it counts the status asks and stops."""

    def __init__(self) -> None:
        self.asked = 0
        self.stopped = 0
        self.end = threading.Event()

    def status(self, submission: str) -> str:
        self.asked += 1
        return "SUCCEEDED" if self.end.is_set() else "RUNNING"

    def stop(self, submission: str) -> None:
        self.stopped += 1


async def test_a_running_job_is_asked_after_seldom_and_every_poll_once_its_run_ended_or_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every second for every run: a tenth of the launcher's CPU in the demo, and as much of the head's dashboard.
    monkeypatch.setattr(as_job, "JOB_POLL_S", 0.02)
    monkeypatch.setattr(as_job, "JOB_IDLE_POLL_S", 60.0)
    jobs = Jobs()
    carrier = as_job.JobCarrier(None, jobs)  # type: ignore[arg-type]
    cancelled, run_ended = asyncio.Event(), asyncio.Event()
    watching = asyncio.create_task(carrier.watch("r1", "r1.attempt1", cancelled, run_ended))
    await asyncio.sleep(0.3)
    assert jobs.asked == 0  # fifteen of the short polls have passed: the job was not asked yet
    run_ended.set()  # the run's end event came: its job ends next
    await async_wait_until(lambda: jobs.asked >= 3, 10, "the job to be asked three times")
    began, asked = time.monotonic(), jobs.asked
    await asyncio.sleep(0.2)
    polls = (time.monotonic() - began) / 0.02
    assert not watching.done() and jobs.asked - asked <= polls + 2  # polled, not spun on the event that is set
    jobs.end.set()
    assert await asyncio.wait_for(watching, 10) == ("SUCCEEDED", False)

    # A cancel wakes the watch at once, stops the job once, and it is polled to its end; without a run_ended event
    # (a caller that has none) the job is polled every JOB_POLL_S throughout.
    for with_end in (True, False):
        jobs = Jobs()
        carrier = as_job.JobCarrier(None, jobs)  # type: ignore[arg-type]
        cancelled = asyncio.Event()
        watching = asyncio.create_task(
            carrier.watch("r2", "r2.attempt1", cancelled, asyncio.Event() if with_end else None)
        )
        if with_end:
            await asyncio.sleep(0.2)
            assert jobs.asked == 0
        else:
            await async_wait_until(lambda jobs=jobs: jobs.asked >= 3, 10, "three asks")  # type: ignore[misc]
        cancelled.set()
        await async_wait_until(lambda jobs=jobs: jobs.stopped == 1, 10, "the stop")  # type: ignore[misc]
        began, asked = time.monotonic(), jobs.asked
        await asyncio.sleep(0.2)
        assert jobs.stopped == 1 and jobs.asked - asked <= (time.monotonic() - began) / 0.02 + 2
        jobs.end.set()
        assert await asyncio.wait_for(watching, 10) == ("SUCCEEDED", True)


async def test_the_launcher_wakes_a_runs_job_watch_on_its_end_event_and_only_its_teams() -> None:
    from types import SimpleNamespace

    from runctl.events import RunSucceeded, new_event
    from services.launcher.service import Launcher

    launcher = Launcher(SimpleNamespace(url="nats://127.0.0.1:1"), None, "/runctl/launcher")  # type: ignore[arg-type]
    launcher.run_ends[("nlp", "r1")] = ended = asyncio.Event()
    # Another team's event naming the same run id wakes nothing.
    await launcher.handle(new_event(RunSucceeded(), team="vision", run_id="r1", source="/t"))
    assert not ended.is_set()
    await launcher.handle(new_event(RunSucceeded(), team="nlp", run_id="r1", source="/t"))
    assert ended.is_set()
