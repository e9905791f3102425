"""RayJobs.client from many threads at once: one local head, whatever the race."""

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
