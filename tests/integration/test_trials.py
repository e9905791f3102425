"""The trial protocol on real sandboxes (dockerd and bubblewrap) over the test task set in tests/data/tasks.

Each task's expected oracle and nop outcomes are in its README; together they cover a sound task, a wrong
solution, an agent timeout, a planted reward, a memory hog, a fork bomb, a network probe and a malformed reward.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runctl.tasks import load_task
from services.sandbox.agents import make_agent
from services.sandbox.backends.docker_backend import DockerBackend
from services.sandbox.backends.local_backend import LocalBackend
from services.sandbox.errors import SandboxError
from services.sandbox.trial import RewardError, TrialRunner, parse_reward
from tests.conftest import ROOT, own_cgroup_parent, sandbox_cgroups

# One worker: the tests take their module's backends with request.getfixturevalue, and each backend's teardown
# checks that nothing labelled test-trials is left, which a test of the module running beside it would break.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("tests/integration/test_trials.py")]
TASKS = ROOT / "tests" / "data" / "tasks"

#: task → (oracle reward, oracle termination, nop reward); None: a verifier error.
EXPECTED: dict[str, tuple[float | None, str, float | None]] = {
    "hello": (1.0, "agent_completed", 0.0),
    "failing": (0.0, "agent_completed", 0.0),
    "timing-out": (1.0, "timeout", 0.0),
    "reward-planting": (0.0, "agent_completed", 0.0),
    "memory-hogging": (1.0, "agent_completed", 0.0),
    "fork-bombing": (1.0, "agent_completed", 0.0),
    "network-probing": (1.0, "agent_completed", 0.0),
    "malformed-reward": (None, "agent_completed", None),
}


def test_the_task_set_is_what_the_expectations_name() -> None:
    assert sorted(p.name for p in TASKS.iterdir() if p.is_dir()) == sorted(EXPECTED)


@pytest.fixture(scope="module")
def docker_runner(docker_host: str) -> Iterator[TrialRunner]:
    backend = DockerBackend(docker_host)
    yield TrialRunner(backend, backend.task_image)
    assert backend.list_owned({"runctl.owner": "test-trials"}) == []
    backend.close()


@pytest.fixture(scope="module")
def local_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrialRunner]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    backend = LocalBackend(root=tmp_path_factory.mktemp("sandboxes"), cgroup_parent=f"{own_cgroup_parent()}-trials")
    yield TrialRunner(backend, backend.task_root)
    assert backend.list_owned() == []
    backend.remove_cgroup_parents()


def runner_for(request: pytest.FixtureRequest, name: str) -> TrialRunner:
    runner: TrialRunner = request.getfixturevalue(f"{name}_runner")
    return runner


@pytest.mark.parametrize("backend", ["docker", "local"])
@pytest.mark.parametrize("task_name", sorted(EXPECTED))
def test_oracle_and_nop_score_as_expected(
    request: pytest.FixtureRequest, backend: str, task_name: str, tmp_path: Path
) -> None:
    runner = runner_for(request, backend)
    task = load_task(TASKS / task_name)
    oracle_reward, oracle_end, nop_reward = EXPECTED[task_name]
    labels = {"runctl.owner": "test-trials"}
    oracle = runner.run(task, make_agent("oracle"), tmp_path / "oracle", labels)
    assert (oracle.reward, oracle.termination_reason) == (oracle_reward, oracle_end), oracle
    nop = runner.run(task, make_agent("nop"), tmp_path / "nop", labels)
    assert nop.reward == nop_reward, nop
    for result, folder in ((oracle, tmp_path / "oracle"), (nop, tmp_path / "nop")):
        assert (folder / "result.json").is_file()
        assert (folder / "logs" / "verifier").is_dir()
        if result.reward is None:
            assert result.failure is not None and result.failure.cause == "verifier"
            assert not result.reward_valid
        else:
            assert result.reward_valid
        assert {"environment_setup", "agent_execution", "verifier", "total"} <= set(result.timings_s)
    assert (tmp_path / "oracle" / "logs" / "agent" / "oracle.txt").exists()


def test_no_bomb_or_planter_outlives_its_trial_on_the_local_backend(local_runner: TrialRunner, tmp_path: Path) -> None:
    for name in ("fork-bombing", "reward-planting"):
        local_runner.run(load_task(TASKS / name), make_agent("oracle"), tmp_path / name)
    root = str(local_runner.backend.root)  # type: ignore[attr-defined]
    assert not processes_of_sandboxes_under(root)


def processes_of_sandboxes_under(root: str) -> list[str]:
    """Live processes of this test's sandboxes: a bwrap naming ``root``, or a process under one (each sandbox's PID
    namespace dies with its init, a bwrap, so a survivor always has one above it). Another test's sandboxes, running
    the same scripts beside this one, are not this test's."""
    table = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,args="], capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in table.splitlines():
        pid, ppid, stat, *args = line.split(None, 3)
        rows[int(pid)] = (int(ppid), stat, " ".join(args))
    found = []
    for pid, (_, stat, args) in rows.items():
        if stat.startswith("Z"):
            continue  # zombies await init
        above, seen = pid, set()
        while above in rows and above not in seen:
            seen.add(above)
            if root in rows[above][2]:
                found.append(f"{pid} {stat} {args}")
                break
            above = rows[above][0]
    return found


def test_a_cgroup_the_kernel_still_holds_keeps_its_sandbox_listed_until_a_destroy_removes_it(
    local_runner: TrialRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.sandbox.backends import local_backend
    from services.sandbox.backends.base import SandboxSpec

    backend = local_runner.backend
    assert isinstance(backend, LocalBackend)
    sandbox = backend.create(SandboxSpec(sandbox_id="held-1", image="/", labels={"runctl.owner": "test-trials"}))
    groups = [Path(g) for g in json.loads((Path(sandbox.handle) / "meta.json").read_text())["cgroups"]]
    if not groups:
        backend.destroy(sandbox)
        pytest.skip("this process may not make cgroups")
    with monkeypatch.context() as m:
        m.setattr(local_backend, "remove_cgroup", lambda group, timeout_s=5.0: False)  # the kernel says EBUSY
        with pytest.raises(SandboxError, match="still holds the cgroups"):
            backend.destroy(sandbox)
    (listed,) = backend.list_owned({"runctl.owner": "test-trials"})  # its record stays: nothing is forgotten
    assert all(g.is_dir() for g in groups)
    backend.destroy_owned(listed)
    assert backend.list_owned() == [] and not Path(sandbox.handle).exists()
    assert not any(g.exists() for g in groups)


def killed_in(backend: LocalBackend, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in another process with ``backend`` (same root and cgroup parent) as ``backend`` there."""
    script = f"""
import os, resource, signal
from pathlib import Path
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.local_backend import LocalBackend

backend = LocalBackend(root=Path({str(backend.root)!r}), cgroup_parent={backend.cgroup_parent!r})
"""
    return subprocess.run([sys.executable, "-c", script + body], cwd=ROOT, capture_output=True, text=True, timeout=60)


def removed_as_listed(backend: LocalBackend, sandbox_id: str) -> None:
    """The sandbox a killed process left is listed by its labels, and destroying it removes its cgroups."""
    made = [g for g in sandbox_cgroups() if g.name == sandbox_id]
    if not made or not os.access("/sys/fs/cgroup/pids", os.W_OK):
        shutil.rmtree(backend.root / sandbox_id)
        pytest.skip("this process may not make cgroups")
    (listed,) = backend.list_owned({"runctl.owner": "test-trials"})
    backend.destroy_owned(listed)
    assert not any(g.exists() for g in made) and backend.list_owned() == []


def test_a_runner_killed_while_it_makes_a_sandbox_leaves_a_record_of_its_cgroups(local_runner: TrialRunner) -> None:
    backend = local_runner.backend
    assert isinstance(backend, LocalBackend)
    # Another process makes a sandbox on the same root and is SIGKILLed with its first cgroup made.
    done = killed_in(
        backend,
        """
def killed_halfway(spec):
    (Path("/sys/fs/cgroup/pids") / backend.cgroup_parent / spec.sandbox_id).mkdir(parents=True)
    os.kill(os.getpid(), signal.SIGKILL)

backend._make_cgroups = killed_halfway
backend.create(SandboxSpec(sandbox_id="killed-1", image="/", labels={"runctl.owner": "test-trials"}))
""",
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    removed_as_listed(backend, "killed-1")  # the record was written first


def test_a_runner_killed_while_it_uploads_to_a_sandbox_leaves_its_record_whole(
    local_runner: TrialRunner, tmp_path: Path
) -> None:
    """An upload to a new top-level path rewrites the sandbox's record; a kill half-way through that write (here the
    kernel's, at a file size limit) must leave the record readable, or the sandbox and its cgroups go unlisted."""
    backend = local_runner.backend
    assert isinstance(backend, LocalBackend)
    (tmp_path / "test.sh").write_text("exit 0\n")
    done = killed_in(
        backend,
        f"""
sandbox = backend.create(SandboxSpec(sandbox_id="torn-1", image="/", labels={{"runctl.owner": "test-trials"}}))
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; the kernel's default kills the writer
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
backend.upload(sandbox, Path({str(tmp_path / "test.sh")!r}), "/tests/test.sh")
""",
    )
    assert done.returncode == -signal.SIGXFSZ, done.stderr
    removed_as_listed(backend, "torn-1")


def test_an_image_that_cannot_be_built_is_an_environment_failure(docker_runner: TrialRunner, tmp_path: Path) -> None:
    task_dir = tmp_path / "task"
    shutil.copytree(TASKS / "hello", task_dir)
    (task_dir / "environment" / "Dockerfile").write_text("FROM runctl-base\nRUN exit 3\n")
    result = docker_runner.run(load_task(task_dir), make_agent("oracle"), tmp_path / "trial")
    assert result.termination_reason == "env_setup_failed" and result.reward is None
    assert result.failure is not None and result.failure.cause == "sandbox"
    assert "building" in result.failure.message and "failed" in result.failure.message


def test_the_local_backend_refuses_build_steps_it_cannot_honour(local_runner: TrialRunner, tmp_path: Path) -> None:
    task_dir = tmp_path / "task"
    shutil.copytree(TASKS / "hello", task_dir)
    (task_dir / "environment" / "Dockerfile").write_text("FROM runctl-base\nRUN apt-get install -y git\n")
    result = local_runner.run(load_task(task_dir), make_agent("oracle"), tmp_path / "trial")
    assert result.termination_reason == "env_setup_failed"
    assert (
        result.failure is not None and "RUN is a build step the local backend cannot honour" in result.failure.message
    )
    assert "BACKEND=docker" in result.failure.message


@pytest.mark.parametrize(
    ("json_text", "txt_text", "expected"),
    [
        ('{"reward": 0.5, "tests": 2}', "1", (0.5, {"reward": 0.5, "tests": 2.0})),
        ('{"passed": 1}', None, (1.0, {"passed": 1.0})),
        (None, " 0.25\n", (0.25, {"reward": 0.25})),
    ],
)
def test_rewards_parse(json_text: str | None, txt_text: str | None, expected: tuple[float, dict[str, float]]) -> None:
    assert parse_reward(json_text, txt_text) == expected


@pytest.mark.parametrize(
    ("json_text", "txt_text"),
    [
        (None, None),
        (None, ""),
        (None, "NaN"),
        (None, "pass"),
        ('{"a": 1, "b": 0}', None),
        ('{"reward": "1"}', None),
        ("[1]", None),
        ('{"reward": true}', None),
        ("{", None),
    ],
)
def test_bad_rewards_are_errors_not_zeros(json_text: str | None, txt_text: str | None) -> None:
    with pytest.raises(RewardError):
        parse_reward(json_text, txt_text)


EXAMPLES = sorted(p for folder in ("tasks", "tasks-heldout") for p in (ROOT / "examples" / folder).iterdir())


@pytest.mark.parametrize("backend", ["docker", "local"])
@pytest.mark.parametrize("task_dir", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_example_tasks_are_sound_on_both_backends(
    request: pytest.FixtureRequest, backend: str, task_dir: Path, tmp_path: Path
) -> None:
    runner = runner_for(request, backend)
    task = load_task(task_dir)
    labels = {"runctl.owner": "test-trials"}
    assert runner.run(task, make_agent("oracle"), tmp_path / "oracle", labels).reward == 1.0
    assert runner.run(task, make_agent("nop"), tmp_path / "nop", labels).reward == 0.0
