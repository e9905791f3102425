"""What task.toml asks of a trial, carried out on real sandboxes (dockerd and bubblewrap): a verifier in a sandbox
of its own, collect hooks, artifacts, a healthcheck, the run's limits over the task's, a hard trial deadline; and
nothing a sandbox wrote may lead out of the trial folder."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runctl.tasks import Task, load_task
from services.sandbox.agents import AgentOutcome, make_agent
from services.sandbox.backends.base import Backend, Sandbox
from services.sandbox.backends.docker_backend import DockerBackend
from services.sandbox.backends.local_backend import LocalBackend
from services.sandbox.trial import TrialLimits, TrialRunner
from tests.conftest import ROOT, own_cgroup_parent

# One worker: the tests take their module's backends with request.getfixturevalue, and each backend's teardown
# checks that nothing labelled test-protocol is left, which a test of the module running beside it would break.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("tests/integration/test_trial_protocol.py")]
HELLO = ROOT / "tests" / "data" / "tasks" / "hello"
LABELS = {"runctl.owner": "test-protocol"}


@pytest.fixture(scope="module")
def docker_backend(docker_host: str) -> Iterator[DockerBackend]:
    backend = DockerBackend(docker_host)
    yield backend
    assert backend.list_owned(LABELS) == []  # agent and verifier sandboxes alike are gone
    backend.close()


@pytest.fixture(scope="module")
def local_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    backend = LocalBackend(root=tmp_path_factory.mktemp("sandboxes"), cgroup_parent=f"{own_cgroup_parent()}-proto")
    yield backend
    assert backend.list_owned() == []
    backend.remove_cgroup_parents()


def backend_for(request: pytest.FixtureRequest, name: str) -> Backend:
    backend: Backend = request.getfixturevalue(f"{name}_backend")
    return backend


def runner(backend: Backend, limits: TrialLimits | None = None) -> TrialRunner:
    image_for = backend.task_image if isinstance(backend, DockerBackend) else backend.task_root  # type: ignore[attr-defined]
    return TrialRunner(backend, image_for, limits or TrialLimits())


def hello_task(
    tmp_path: Path,
    *,
    top: str = "",
    verifier: str = "",
    tables: str = "",
    solve: str | None = None,
    test: str | None = None,
) -> Task:
    """The `hello` task with more in its task.toml (``top``-level keys, ``[verifier]`` keys, more tables after
    ``[environment]``) and another solve.sh or test.sh."""
    folder = tmp_path / "task"
    shutil.copytree(HELLO, folder)
    (folder / "task.toml").write_text(
        f'schema_version = "1.1"\n{top}[task]\nname = "runctl/hello"\n[agent]\ntimeout_sec = 60\n'
        f"[verifier]\ntimeout_sec = 30\n{verifier}"
        f'[environment]\ncpus = 1\nmemory_mb = 256\nnetwork_mode = "no-network"\n{tables}'
    )
    if solve is not None:
        (folder / "solution" / "solve.sh").write_text("#!/bin/sh\n" + solve)
    if test is not None:
        (folder / "tests" / "test.sh").write_text("#!/bin/sh\n" + test)
    return load_task(folder)


SEPARATE = 'environment_mode = "separate"\n'


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_a_separate_verifier_runs_apart_and_sees_only_the_declared_artifacts(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    sandboxes = backend_for(request, backend)
    # The agent writes its answer, a file of its own in /tmp, and a convention artifact; only what the task
    # declares (the answer) and /logs/artifacts reach the verifier's sandbox.
    solve = "echo hello > /app/hello.txt; echo secret > /tmp/agent-only; echo seen > /logs/artifacts/note.txt\n"
    test = (
        "r=1; grep -qx hello /app/hello.txt || r=0; [ -e /tmp/agent-only ] && r=0; "
        "grep -qx seen /logs/artifacts/note.txt || r=0; echo $r > /logs/verifier/reward.txt\n"
    )
    declared = hello_task(
        tmp_path / "a", top='artifacts = ["/app/hello.txt"]\n', verifier=SEPARATE, solve=solve, test=test
    )
    result = runner(sandboxes).run(declared, make_agent("oracle"), tmp_path / "a" / "trial", LABELS)
    assert result.reward == 1.0, result
    assert (tmp_path / "a" / "trial" / "artifacts" / "app" / "hello.txt").read_text() == "hello\n"
    manifest = json.loads((tmp_path / "a" / "trial" / "artifacts" / "manifest.json").read_text())
    assert manifest == [{"source": "/app/hello.txt", "destination": "app/hello.txt", "found": True}]
    assert (tmp_path / "a" / "trial" / "logs" / "verifier" / "test-stdout.txt").exists()

    # Without the artifact the verifier cannot see the agent's work: it is not in the agent's sandbox.
    undeclared = hello_task(tmp_path / "b", verifier=SEPARATE, solve=solve)
    result = runner(sandboxes).run(undeclared, make_agent("oracle"), tmp_path / "b" / "trial", LABELS)
    assert result.reward == 0.0, result


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_collect_hooks_run_after_the_agent_and_what_they_write_is_kept(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    hooks = (
        '[[verifier.collect]]\ncommand = "cp /app/hello.txt /logs/artifacts/collected.txt"\n'
        '[[verifier.collect]]\ncommand = "exit 4"\n'
        # A hook cannot plant a reward either, nor leave a process that would.
        '[[verifier.collect]]\ncommand = "echo 1 > /logs/verifier/reward.txt; sleep 300 > /dev/null 2>&1 &"\n'
    )
    test = (
        "grep -qx hello /logs/artifacts/collected.txt && echo 0.5 > /logs/verifier/reward.txt "
        "|| echo 0 > /logs/verifier/reward.txt\n"
    )
    task = hello_task(tmp_path, tables=hooks, test=test)
    result = runner(backend_for(request, backend)).run(task, make_agent("oracle"), tmp_path / "trial", LABELS)
    assert result.reward == 0.5, result  # the hook's copy was there; the hook's planted 1 was not
    assert (tmp_path / "trial" / "logs" / "artifacts" / "collected.txt").read_text() == "hello\n"
    assert any("collect hook `exit 4` exited 4" in note for note in result.notes)


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_a_healthcheck_that_never_passes_is_an_environment_failure(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    check = '[environment.healthcheck]\ncommand = "test -f /app/ready"\ninterval_sec = 0.1\nretries = 2\n'
    task = hello_task(tmp_path / "never", tables=check)
    result = runner(backend_for(request, backend)).run(task, make_agent("oracle"), tmp_path / "never" / "t", LABELS)
    assert result.termination_reason == "env_setup_failed" and result.reward is None
    assert result.failure is not None and "healthcheck `test -f /app/ready` failed 2 times" in result.failure.message
    passing = hello_task(tmp_path / "ok", tables='[environment.healthcheck]\ncommand = "true"\n')
    assert runner(backend_for(request, backend)).run(passing, make_agent("oracle"), tmp_path / "ok" / "t").reward == 1


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_links_a_sandbox_leaves_are_dropped_and_a_linked_reward_is_not_read(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    plant = "echo hello > /app/hello.txt; ln -s /etc/shadow /logs/agent/x; ln -s /etc/passwd /logs/artifacts/y\n"
    task = hello_task(tmp_path / "a", solve=plant)
    result = runner(backend_for(request, backend)).run(task, make_agent("oracle"), tmp_path / "a" / "t", LABELS)
    assert result.reward == 1.0, result
    folder = tmp_path / "a" / "t"
    assert [p for p in folder.rglob("*") if p.is_symlink()] == []
    assert not (folder / "logs" / "agent" / "x").exists() and not (folder / "logs" / "artifacts" / "y").exists()
    # The verifier itself links its reward to a file of the machine: it is refused, never followed.
    linked = hello_task(tmp_path / "b", test="ln -s /etc/hostname /logs/verifier/reward.txt\n")
    result = runner(backend_for(request, backend)).run(linked, make_agent("oracle"), tmp_path / "b" / "t", LABELS)
    assert result.reward is None and not result.reward_valid
    assert result.failure is not None and result.failure.cause == "verifier"
    assert [p for p in (tmp_path / "b" / "t").rglob("*") if p.is_symlink()] == []


class LimitsProbe:
    """An agent that reads, from outside, the limits and network its sandbox was really given."""

    name = "limits-probe"

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def setup(self, backend: Backend, sandbox: Sandbox, task: Task) -> None:
        pass

    def run(self, backend: Backend, sandbox: Sandbox, task: Task, timeout_s: float) -> AgentOutcome:
        self.seen["timeout_s"] = timeout_s
        if isinstance(backend, DockerBackend):
            host = backend.client.containers.get(sandbox.handle).attrs["HostConfig"]
            self.seen |= {"memory_mb": host["Memory"] // 2**20, "cpus": host["NanoCpus"] / 1e9}
            self.seen["network"] = host["NetworkMode"]
        else:
            meta = json.loads((Path(sandbox.handle) / "meta.json").read_text())
            self.seen |= {"memory_mb": meta["limits"]["memory_mb"], "cpus": meta["limits"]["cpus"]}
            self.seen["network"] = meta["network"]
            for group in meta["cgroups"]:
                if "/memory/" in group:
                    self.seen["cgroup_memory_mb"] = int(Path(group, "memory.limit_in_bytes").read_text()) // 2**20
        return AgentOutcome("agent_completed")


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_the_runs_sandbox_limits_replace_the_tasks_own(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    sandboxes = backend_for(request, backend)
    task = hello_task(tmp_path)  # cpus = 1, memory_mb = 256
    probe = LimitsProbe()
    runner(sandboxes).run(task, probe, tmp_path / "own", LABELS)
    assert (probe.seen["memory_mb"], probe.seen["cpus"]) == (256, 1.0)
    probe = LimitsProbe()
    runner(sandboxes, TrialLimits(cpus=0.5, memory_mb=300)).run(task, probe, tmp_path / "run", LABELS)
    assert (probe.seen["memory_mb"], probe.seen["cpus"]) == (300, 0.5)
    if "cgroup_memory_mb" in probe.seen:  # as root: the kernel enforces it
        assert probe.seen["cgroup_memory_mb"] == 300


def test_agent_network_replaces_the_tasks_network(local_backend: LocalBackend, tmp_path: Path) -> None:
    probe = LimitsProbe()
    runner(local_backend).run(hello_task(tmp_path / "a"), probe, tmp_path / "a" / "t", LABELS)
    assert probe.seen["network"] == "no-network"
    probe = LimitsProbe()
    runner(local_backend, TrialLimits(agent_network="public")).run(hello_task(tmp_path / "b"), probe, tmp_path / "b")
    assert probe.seen["network"] == "public"


def test_the_hard_trial_deadline_caps_the_agent(local_backend: LocalBackend, tmp_path: Path) -> None:
    task = hello_task(tmp_path, solve="echo hello > /app/hello.txt; sleep 60\n")  # [agent] timeout_sec = 60
    result = runner(local_backend, TrialLimits(trial_timeout_s=3)).run(task, make_agent("oracle"), tmp_path / "t")
    assert result.termination_reason == "timeout"
    assert result.timings_s["agent_execution"] < 45  # about the 3 s, far from the task's own 60
    # The agent took the whole trial's time: no verifier runs past the hard limit, so there is no reward.
    assert result.reward is None and result.failure is not None
    assert "no time was left to verify (TRIAL_HARD_TIMEOUT_SEC=3)" in result.failure.message
