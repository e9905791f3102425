"""The sandbox service's public face: run one trial of a task on a backend, and check that a task is sound.

``runctl task run`` and ``runctl task check`` call this in-process; the service runs the same code for runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from runctl.tasks import Task, load_task
from services.sandbox.agents import make_agent
from services.sandbox.backends.base import Backend
from services.sandbox.trial import TrialResult, TrialRunner

BackendName = Literal["docker", "local", "kubernetes"]
BACKENDS: tuple[BackendName, ...] = ("docker", "local", "kubernetes")


@contextmanager
def open_backend(
    name: BackendName, registry: str | None = None
) -> Iterator[tuple[Backend, Callable[[Task], str | None]]]:
    """A backend and the function that turns a task into what its ``create`` needs (an image, a root)."""
    if name == "docker":
        from services.sandbox.backends.docker_backend import DockerBackend

        docker = DockerBackend()
        try:
            yield docker, lambda task: docker.task_image(task, registry)
        finally:
            docker.close()
        return
    if name == "local":
        from services.sandbox.backends.local_backend import LocalBackend

        local = LocalBackend()
        try:
            yield local, local.task_root
        finally:
            local.remove_cgroup_parents()
        return
    if name == "kubernetes":
        from services.sandbox.backends.kubernetes_backend import KubernetesBackend

        kube = KubernetesBackend(namespace=os.environ.get("K8S_NAMESPACE", "runctl"))
        try:
            yield kube, lambda task: kube.task_image(task, registry)
        finally:
            kube.close()
        return
    raise ValueError(f"no sandbox backend {name!r}; use one of: {', '.join(BACKENDS)}")


def run_task(
    task_dir: Path, agent_name: str, backend_name: BackendName, out_dir: Path, labels: dict[str, str] | None = None
) -> TrialResult:
    """One trial of the task in ``task_dir`` by a built-in agent; its folder is ``out_dir``."""
    task = load_task(task_dir)
    agent = make_agent(agent_name)
    with open_backend(backend_name) as (backend, image_for):
        return TrialRunner(backend, image_for).run(task, agent, out_dir, labels)


@dataclass(frozen=True)
class Soundness:
    """``task check``'s verdict: the oracle must score 1 and nop 0."""

    oracle: TrialResult
    nop: TrialResult

    @property
    def sound(self) -> bool:
        return self.oracle.reward == 1.0 and self.nop.reward == 0.0

    def problems(self) -> list[str]:
        found = []
        for result, want in ((self.oracle, 1.0), (self.nop, 0.0)):
            if result.reward != want:
                why = result.failure.message if result.failure else f"reward {result.reward}"
                found.append(f"{result.agent} should score {want:g}: {why}")
        return found


def check_task(task_dir: Path, backend_name: BackendName, out_dir: Path) -> Soundness:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    oracle = run_task(task_dir, "oracle", backend_name, out_dir / f"oracle-{stamp}")
    nop = run_task(task_dir, "nop", backend_name, out_dir / f"nop-{stamp}")
    return Soundness(oracle, nop)
