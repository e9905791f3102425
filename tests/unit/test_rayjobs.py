"""RayJobs.client from many threads at once: one local head, whatever the race; a submission while the jobs server
has no agent yet waits for one."""

from __future__ import annotations

import sys
import threading
import time
import types
from typing import Any

import pytest

from services.launcher.carry import rayjob
from services.launcher.carry.rayjob import LocalHead, RayJobs


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
