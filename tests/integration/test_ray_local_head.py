"""The runner's local Ray head survives a start Ray gives up on: Ray waits a fixed 30 s for its node to register,
which a loaded machine can miss. The first start is made to fail that way (the node lookup raises Ray's own
timeout); the processes it left are killed and the second start attaches. Two such starts fail the phase and leave
nothing running either."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.infra import ray_head

pytestmark = pytest.mark.integration

PROGRAM = """
import json, os, sys
import ray._private.services as services
from services.launcher.errors import EngineError
from services.launcher.rollout import cluster

real_get_node = services.get_node
failures = int(sys.argv[1])
left = []

def get_node(*args, **kwargs):
    if len(left) < failures:
        # What the start left running at the moment Ray gives up on it.
        left.append(sorted(cluster._descendants(os.getpid())))
        raise Exception("The current node timed out during startup. This could happen because ...")
    return real_get_node(*args, **kwargs)

services.get_node = get_node
try:
    found = cluster.connect(None, 1, timeout_s=60)
    result = {"nodes": len(found.nodes), "local": found.started_local_head}
    raylets = [p for p in cluster._descendants(os.getpid()) if cluster._cmdline(p).split(" ")[0].endswith("/raylet")]
    result["raylet_env"] = [
        line for p in raylets for line in open(f"/proc/{p}/environ", "rb").read().decode().split(chr(0))
        if line.split("=")[0] in cluster.LOCAL_HEAD_ENV
    ]
except EngineError as e:
    result = {"error": str(e)}
def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
result["left_alive"] = [pid for pids in left for pid in pids if alive(pid)]
result["failed_starts"] = len(left)
result["left"] = [len(pids) for pids in left]
cluster.release()
result["after_release"] = sorted(cluster._descendants(os.getpid()))
print(json.dumps(result))
"""


def run(failures: int) -> dict[str, object]:
    reason = ray_head.why_unavailable()
    if reason:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(failures)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_start_that_timed_out_is_cleaned_up_and_tried_again() -> None:
    result = run(failures=1)
    assert result["failed_starts"] == 1 and result["nodes"] == 1 and result["local"] is True, result
    assert result["left"] and result["left"][0] >= 2, result  # the GCS and the raylet at least  # type: ignore[index]
    assert result["left_alive"] == [], result
    assert result["after_release"] == [], result
    # The head's raylet got runctl's environment: no usage statistics, no workers started ahead.
    assert sorted(result["raylet_env"]) == ["RAY_USAGE_STATS_ENABLED=0", "RAY_prestart_worker_first_driver=0"]


def test_two_timed_out_starts_fail_the_phase_with_the_fix() -> None:
    result = run(failures=2)
    assert result["failed_starts"] == 2 and "error" in result, result
    assert result["left_alive"] == [] and result["after_release"] == [], result  # the runner outlives the run
    error = str(result["error"])
    assert "could not attach to a local Ray head" in error and "timed out during startup" in error, error
    assert "ray start --head" in error and "RAY_ADDRESS" in error, error
