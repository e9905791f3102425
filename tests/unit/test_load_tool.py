"""The load tool really loads the machine: its busy processes keep running and burn CPU until it stops them."""

from __future__ import annotations

import os
import time

from tests.infra.load import start_busy, stop_busy


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_busy_processes_spin_until_stopped() -> None:
    busy = start_busy(1, nice=5)
    try:
        pid = busy[0].pid
        deadline = time.monotonic() + 30
        while _cpu_seconds(pid) < 0.3:
            assert busy[0].poll() is None, f"the busy process exited with {busy[0].returncode}"
            assert time.monotonic() < deadline, "the busy process used under 0.3 s of CPU in 30 s"
            time.sleep(0.05)
        assert os.getpriority(os.PRIO_PROCESS, pid) == 5
    finally:
        stop_busy(busy)
    assert busy[0].returncode == -9
