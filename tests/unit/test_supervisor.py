"""The supervisor's restart policy, with real child processes that die at once."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from runctl.stack import BACKOFF_START_S, Child, Supervisor


def test_a_child_that_keeps_dying_is_restarted_with_doubling_back_off(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path, nats_port=1, tracker_port=2)
    alive = Child("steady", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "steady.log")
    dying = Child("dying", [sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "dying.log")
    supervisor.nats, supervisor.services = alive, [dying]
    for child in (alive, dying):
        child.start(supervisor.env)
    delays: list[float] = []
    deadline = time.monotonic() + 20
    try:
        while dying.restarts < 3 and time.monotonic() < deadline:
            waiting = dying.restart_at is not None
            before = time.monotonic()
            if supervisor._tend() and not waiting and dying.restart_at is not None:
                delays.append(dying.restart_at - before)  # a death was just seen: its restart is scheduled
            time.sleep(0.02)
        assert dying.restarts == 3
        assert alive.restarts == 0
        expected = [BACKOFF_START_S, 2 * BACKOFF_START_S, 4 * BACKOFF_START_S]
        assert delays[:3] == [pytest.approx(e, abs=0.05) for e in expected]
        assert dying.backoff_s == 8 * BACKOFF_START_S
    finally:
        for child in (alive, dying):
            child.stop(5)
            if child.log_file is not None:
                child.log_file.close()
