"""The suite's own timings plugin (tests/infra/timings.py): what it calls each process a test started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.infra.timings import kind_of

PY = "/repo/.venv/bin/python"


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (f"{PY} -m vllm.entrypoints.openai.api_server --model /m --port 1", "vllm"),
        (f"{PY} -m runctl_replica_serve --model /m --port 1", "vllm"),  # a CPU replica, and its engine core forked
        # A run's replica: the group watcher's two processes carry the server's command line; one server is counted.
        (
            f"{PY} -m services.launcher.rollout.groupwatch -- {PY} -m runctl_replica_serve --model /m",
            None,
        ),
        ("/repo/.venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/x", "ray-head"),
        ("/repo/.venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --node=1", "ray-node"),
        ("dockerd -H unix:///tmp/d.sock", "dockerd"),
        (f"{PY} -m services.launcher", "service"),
        ("bwrap --unshare-all -- sh", "sandbox"),
        (f"{PY} /repo/.venv/bin/runctl run cfg.env --run-id r", "trainer"),
        (f"{PY} -m pytest", None),
    ],
)
def test_each_started_process_is_named_by_its_kind(cmdline: str, kind: str | None) -> None:
    assert kind_of(cmdline) == kind


def test_the_cores_busy_share_comes_from_idle_ticks_against_all_ticks() -> None:
    from tests.infra.timings import cpu_busy, cpu_times

    assert cpu_busy((100, 400), (130, 800)) == pytest.approx(1 - 30 / 400)
    assert cpu_busy(None, (1, 2)) is None and cpu_busy((1, 2), (1, 2)) is None
    now = cpu_times()
    assert now is not None and 0 <= now[0] <= now[1]


BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"


def test_cpu_is_charged_to_the_test_that_started_the_process_and_a_child_of_no_kind_takes_its_parents(
    tmp_path: Path,
) -> None:
    """A process a test started (named ``ray::…``, a kind) burns CPU, and so does its child (a plain Python, no
    kind): both are charged to the test, both as ``ray-worker``; a process of another run is charged to no one."""
    from tests.infra import shared
    from tests.infra.timings import Timings, stat_of

    (tmp_path / "child.py").write_text(BURN + "time.sleep(60)\n")
    (tmp_path / "parent.py").write_text(
        # Its own name is ray::Actor, so it has no sys.executable: the child's Python is named.
        f"import subprocess\nsubprocess.Popen([{sys.executable!r}, {str(tmp_path / 'child.py')!r}])\n"
        + BURN
        + "time.sleep(60)\n"
    )
    timings = Timings(tmp_path / "timings.json")
    timings._stop.set()  # sampled here, not by its thread
    timings.run = b"run-a"
    ours = {**os.environ, shared.ENV: "run-a", "PYTEST_CURRENT_TEST": "tests/x.py::test_a (call)"}
    started = [
        subprocess.Popen(
            ["bash", "-c", f"exec -a ray::Actor {sys.executable} {tmp_path / 'parent.py'}"],
            env=ours,
            start_new_session=True,
        ),
        subprocess.Popen(
            [sys.executable, str(tmp_path / "child.py")], env={**ours, shared.ENV: "run-b"}, start_new_session=True
        ),
    ]
    try:
        record = timings.records["tests/x.py::test_a"]
        deadline = time.monotonic() + 30
        while record.cpu_s() < 1.1 and time.monotonic() < deadline:  # two processes of 0.6 s each
            time.sleep(0.2)
            timings.sample()
            timings.charge()
        assert record.cpu_s() >= 1.1, record.cpu_by_kind()
        assert set(record.cpu_by_kind()) == {"ray-worker"}, record.cpu_by_kind()
        assert record.starts() == {"ray-worker": 1}
        assert set(timings.records) == {"tests/x.py::test_a"}  # run-b's process is no test's
        assert stat_of(str(os.getpid()))[0] == os.getppid()  # type: ignore[index]
    finally:
        for process in started:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
