"""The supervisor's restart policy, with real child processes that die at once."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from runctl.stack import BACKOFF_START_S, Child, Supervisor


def test_a_child_that_keeps_dying_is_restarted_with_doubling_back_off(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path, nats_port=1, tracker_port=2)
    alive = Child("steady", [sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "steady.log")
    dying = Child("dying", [sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "dying.log")
    # No bus relay (a supervisor on a host with a routable interface as root makes one): only these two children.
    supervisor.nats, supervisor.services, supervisor.relays = alive, [dying], []
    for child in (alive, dying):
        child.start(supervisor.env)
    # Each scheduled delay, bracketed by the clock read just before and just after the call that scheduled it: the
    # supervisor read its "now" in between, so the delay lies in the bracket however long the call was preempted.
    # The back-off in force at each death is compared exactly, so the three delays are told apart whatever the load.
    brackets: list[tuple[float, float]] = []
    backoffs: list[float] = []
    deadline = time.monotonic() + 60
    try:
        while dying.restarts < 3 and time.monotonic() < deadline:
            waiting = dying.restart_at is not None
            backoff = dying.backoff_s
            before = time.monotonic()
            changed = supervisor._tend()
            after = time.monotonic()
            if changed and not waiting and dying.restart_at is not None:
                # a death was just seen: its restart is scheduled
                brackets.append((dying.restart_at - after, dying.restart_at - before))
                backoffs.append(backoff)
            time.sleep(0.02)
        assert dying.restarts == 3
        assert alive.restarts == 0
        expected = [BACKOFF_START_S, 2 * BACKOFF_START_S, 4 * BACKOFF_START_S]
        assert backoffs == expected
        for (low, high), delay in zip(brackets, expected, strict=True):
            # 1e-6: restart_at - before rounds differently from the supervisor's now + backoff, by an ulp or so
            assert low - 1e-6 <= delay <= high + 1e-6, (low, delay, high)
        assert dying.backoff_s == 8 * BACKOFF_START_S
    finally:
        for child in (alive, dying):
            child.stop(5)
            if child.log_file is not None:
                child.log_file.close()
