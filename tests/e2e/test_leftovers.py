"""Nothing left behind: `runctl down` stops everything the stack started, a Ray head a killed launcher had started
included, whether a restarted launcher took it over or nothing could."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from runctl.home import group_members, is_same_process, read_stack_state
from tests.conftest import wait_until
from tests.e2e.conftest import Cli, port_args
from tests.infra import ray_head as ray_infra
from tests.integration.test_runner_jobs import oracle_eval

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(ray_infra.why_unavailable() or shutil.which("bwrap") is None),
        reason=str(ray_infra.why_unavailable() or "bubblewrap is not installed"),
    ),
]


def submitted(stack: Cli, config: Path) -> str:
    return re.search(r"submitted (\S+)", stack("submit", str(config)).stdout).group(1)  # type: ignore[union-attr]


def trials_of(stack: Cli, run_id: str) -> int:
    shown = stack("show", run_id, "--json", check=False)
    return (
        sum(e["name"] == "trial.finished" for e in json.loads(shown.stdout)["events"]) if shown.returncode == 0 else 0
    )


def ray_head(stack: Cli) -> int:
    path = stack.home / "owned" / "ray-head.json"
    wait_until(path.exists, 120, "the launcher's Ray head")
    pid = int(json.loads(path.read_text())["pid"])
    assert group_members(pid), "the Ray head is not running"
    return pid


@pytest.mark.timeout(900)  # waits of up to 120 + 240 + 300 s
def test_down_stops_the_ray_head_of_a_killed_launcher_whoever_is_left_to_stop_it(stack: Cli, tmp_path: Path) -> None:
    run_id = submitted(stack, oracle_eval(tmp_path, 8))
    head = ray_head(stack)
    wait_until(lambda: trials_of(stack, run_id) >= 2, 240, "two trials", interval_s=0.5)
    state = read_stack_state(stack.home)
    assert state is not None
    os.kill(state.children["launcher"].pid, signal.SIGKILL)  # the supervisor starts another; the run goes on
    wait_until(lambda: '"succeeded"' in stack("show", run_id, "--json").stdout, 300, "the run to succeed")
    assert group_members(head)  # the new launcher took the head over: stopping, it stops the head too
    stack("down")
    assert group_members(head) == [], "the Ray head outlived runctl down"
    assert not (stack.home / "owned" / "ray-head.json").exists()

    # Now with nothing left to stop it: the supervisor and the launcher both killed; `runctl down` does it.
    stack("up", *port_args())
    (tmp_path / "again").mkdir()
    submitted(stack, oracle_eval(tmp_path / "again", 8))
    head = ray_head(stack)
    temp = Path(json.loads((stack.home / "owned" / "ray-head.json").read_text())["extra"]["temp_dir"])
    state = read_stack_state(stack.home)
    assert state is not None
    os.kill(state.supervisor.pid, signal.SIGKILL)
    os.kill(state.children["launcher"].pid, signal.SIGKILL)
    wait_until(lambda: not is_same_process(state.children["launcher"]), 30, "the launcher to die")
    result = stack("down")
    assert f"ray-head (process group {head})" in result.stdout
    assert group_members(head) == [], "the Ray head outlived runctl down"
    assert not temp.exists(), f"runctl down left the Ray head's session folder {temp}"
    assert not any(is_same_process(r) for r in state.children.values())
