"""The sandbox service's face: the one module of the sandbox service that code outside ``services/sandbox`` imports.

``runctl task run`` and ``runctl task check`` run one trial of a task on a backend, in-process, with the code the
service runs. A run's runner opens a backend here, books its sandboxes in the service's ledger (:func:`booked`) and
drives agents and trials through it. The validator's host probes ask here where a run's backend finds its daemon
or cluster and whether the local backend can work on this machine: the runner asks the same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from runctl.config.models import RunConfig
from runctl.tasks import Task, load_task
from services.sandbox.agents import Agent, AgentOutcome, make_agent
from services.sandbox.backends.base import Attachable, Backend, ExecStream, Sandbox, SandboxError
from services.sandbox.booked import booked
from services.sandbox.ledger import LedgerEntry as SandboxEntry
from services.sandbox.ledger import SandboxLedger, take_seat_within
from services.sandbox.settings import SandboxSettings, docker_host, kubeconfig_path
from services.sandbox.trial import TrialLimits, TrialResult, TrialRunner

__all__ = [
    "CONFIG_BACKENDS",
    "Agent",
    "AgentOutcome",
    "Attachable",
    "Backend",
    "BackendSettings",
    "Sandbox",
    "SandboxError",
    "SandboxLedger",
    "SandboxSettings",
    "TrialLimits",
    "TrialRunner",
    "booked",
    "ExecStream",
    "check_task",
    "docker_host",
    "kubeconfig_path",
    "local_backend_problem",
    "local_disk_problem",
    "local_limits_problem",
    "local_public_problem",
    "local_task_problem",
    "make_agent",
    "open_backend",
    "run_task",
    "sandbox_entry",
    "take_seat_within",
]

BackendName = Literal["docker", "local", "kubernetes"]
BACKENDS: tuple[BackendName, ...] = ("docker", "local", "kubernetes")
#: The config's BACKEND values, as backend names.
CONFIG_BACKENDS: dict[str, BackendName] = {"local": "local", "docker": "docker", "k8s": "kubernetes"}


@dataclass(frozen=True)
class BackendSettings:
    """What opening a backend takes from a run's config (the sandbox service uses the defaults)."""

    registry: str | None = None
    docker_host: str | None = None
    kubeconfig: str | None = None
    namespace: str | None = None
    pod_startup_timeout_s: float = 1200.0
    pod_active_deadline_s: int = 6000
    bundle_claim: str | None = None

    @classmethod
    def of(cls, config: RunConfig) -> BackendSettings:
        """The settings a run's config names: IMAGE_REGISTRY, DOCKER_HOST, KUBECONFIG, K8S_NAMESPACE, POD_*,
        K8S_BUNDLE_CLAIM."""
        return cls(
            registry=config.image_registry,
            docker_host=config.docker_host,
            kubeconfig=config.kubeconfig,
            namespace=config.k8s_namespace,
            pod_startup_timeout_s=float(config.pod_startup_timeout_sec),
            pod_active_deadline_s=config.pod_active_deadline_sec,
            bundle_claim=config.k8s_bundle_claim,
        )


@contextmanager
def open_backend(
    name: BackendName, settings: BackendSettings = BackendSettings()
) -> Iterator[tuple[Backend, Callable[[Task], str | None]]]:
    """A backend and the function that turns a task into what its ``create`` needs (an image, a root).

    Raises:
        SandboxError: the backend cannot be used here (no bubblewrap, no Docker daemon, no credentials).
    """
    registry = settings.registry
    if name == "docker":
        from services.sandbox.backends.docker_backend import DockerBackend

        docker = DockerBackend(docker_host(settings.docker_host))
        try:
            yield docker, lambda task: docker.task_image(task, registry)
        finally:
            docker.close()
        return
    if name == "local":
        from services.sandbox.backends.local_backend import LocalBackend

        local = LocalBackend(cgroup_parent=SandboxSettings.from_env().cgroup)  # as the service's
        try:
            yield local, local.task_root
        finally:
            local.remove_cgroup_parents()
        return
    if name == "kubernetes":
        from runctl.bundles import bundles_root
        from services.sandbox.backends.kubernetes_backend import KubernetesBackend

        kube = KubernetesBackend(
            kubeconfig=kubeconfig_path(settings.kubeconfig),
            namespace=settings.namespace or SandboxSettings.from_env().k8s_namespace,
            startup_timeout_s=settings.pod_startup_timeout_s,
            active_deadline_s=settings.pod_active_deadline_s,
            bundle_claim=settings.bundle_claim,
            bundle_root=bundles_root(),
        )
        try:
            yield kube, lambda task: kube.task_image(task, registry)
        finally:
            kube.close()
        return
    raise SandboxError(f"no sandbox backend {name!r}. Fix: use one of: {', '.join(BACKENDS)}.")


def local_backend_problem() -> str | None:
    """Why BACKEND=local cannot make sandboxes on this machine (with the fix), or None when it can."""
    from services.sandbox.backends.local_backend import bubblewrap_problem

    return bubblewrap_problem()


def sandbox_entry(values: dict[str, object]) -> SandboxEntry:
    """A sandbox ledger entry from its JSON fields (as a runner sends it to the launcher's desk).

    Raises:
        TypeError: a field is missing or unknown.
        ValueError: a field has the wrong type.
    """
    entry = SandboxEntry(**values)  # type: ignore[arg-type]
    for name, kind in (("sandbox_id", str), ("owner", str), ("team", str), ("run_id", str), ("seat", str)):
        if not isinstance(getattr(entry, name), kind):
            raise ValueError(f"{name} is a {kind.__name__}")
    return entry


def local_limits_problem() -> str | None:
    """Why local sandboxes get no cgroup limits on this host (None when they do, on cgroup v1 or v2)."""
    from services.sandbox.backends.local_backend import cgroup_limits_problem

    return cgroup_limits_problem()


def local_disk_problem() -> str | None:
    """Why local sandboxes get no disk limit (a task's storage_mb) on this host, or None."""
    from services.sandbox.backends.disk import disk_limit_problem

    return disk_limit_problem()


def local_public_problem() -> str | None:
    """Why the local backend cannot give a sandbox a network of its own with a route out (with the fix), or None."""
    from services.sandbox.backends.netns import public_net_problem

    return public_net_problem()


def local_task_problem(task: Task) -> str | None:
    """Why the local backend cannot make this task's sandbox (a build step it cannot honour, a COPY from outside
    the task's folder), or None."""
    from runctl.home import home
    from services.sandbox.backends.local_backend import task_plan

    try:
        task_plan(task, home() / "rootfs")
    except SandboxError as e:
        return e.message
    return None


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
