"""``python -m services.sandbox``: the sandbox service process.

Environment: ``RUNCTL_SANDBOX_BACKENDS`` (default ``local,docker``: each one that can start here is served; add
``kubernetes`` with ``KUBECONFIG`` and ``K8S_NAMESPACE``),
``RUNCTL_SANDBOX_CAPS`` (``team=N,…``), ``RUNCTL_SANDBOX_DEFAULT_CAP`` (64), ``RUNCTL_SANDBOX_SCOPE`` (``default``:
the label that tells this deployment's sandboxes from another's on a shared Docker daemon),
``RUNCTL_SANDBOX_CGROUP`` (``runctl``: the parent cgroup folder of local sandboxes), ``RUNCTL_SANDBOX_WARM`` (0:
sandboxes kept ready per kind of sandbox once that kind has been asked for).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from runctl.service import ServiceRuntime, run_service
from runctl.tasks import Task
from services.sandbox.backends.base import Backend, SandboxError
from services.sandbox.owners import DEFAULT_TEAM_CAP, scope_from_env, team_caps
from services.sandbox.service import SandboxService

log = logging.getLogger(__name__)


def available_backends(names: list[str]) -> dict[str, tuple[Backend, Callable[[Task], str | None]]]:
    found: dict[str, tuple[Backend, Callable[[Task], str | None]]] = {}
    for name in names:
        try:
            if name == "local":
                from services.sandbox.backends.local_backend import LocalBackend

                local = LocalBackend(cgroup_parent=os.environ.get("RUNCTL_SANDBOX_CGROUP", "runctl"))
                found["local"] = (local, local.task_root)
            elif name == "docker":
                from services.sandbox.backends.docker_backend import DockerBackend

                docker = DockerBackend()
                found["docker"] = (docker, docker.task_image)
            elif name == "kubernetes":
                from services.sandbox.backends.kubernetes_backend import KubernetesBackend

                kube = KubernetesBackend(namespace=os.environ.get("K8S_NAMESPACE", "runctl"))
                found["kubernetes"] = (kube, kube.task_image)
            else:
                log.warning("unknown sandbox backend %s: skipped", name)
        except SandboxError as e:
            log.warning("sandbox backend %s is not available here: %s", name, e.message)
    return found


async def main(runtime: ServiceRuntime) -> None:
    names = [n.strip() for n in os.environ.get("RUNCTL_SANDBOX_BACKENDS", "local,docker").split(",") if n.strip()]
    service = SandboxService(
        runtime,
        available_backends(names),
        caps=team_caps(os.environ.get("RUNCTL_SANDBOX_CAPS", "")),
        default_cap=int(os.environ.get("RUNCTL_SANDBOX_DEFAULT_CAP", DEFAULT_TEAM_CAP)),
        scope=scope_from_env(),
        warm=int(os.environ.get("RUNCTL_SANDBOX_WARM", "0")),
    )
    await service.start()


if __name__ == "__main__":
    run_service(main, "sandbox")
