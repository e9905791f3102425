"""``python -m services.sandbox``: the sandbox service process. Its settings (``RUNCTL_SANDBOX_*``, ``K8S_NAMESPACE``,
``DOCKER_HOST``, ``KUBECONFIG``) are ``settings.SandboxSettings``, listed in docs/services.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runctl.service import ServiceRuntime, run_service
from runctl.tasks import Task
from services.sandbox.backends.base import Backend, SandboxError
from services.sandbox.service import SandboxService
from services.sandbox.settings import DEFAULT_DOCKER_HOST, SandboxSettings

log = logging.getLogger(__name__)


def available_backends(settings: SandboxSettings) -> dict[str, tuple[Backend, Callable[[Task], str | None]]]:
    found: dict[str, tuple[Backend, Callable[[Task], str | None]]] = {}
    for name in settings.backends:
        try:
            if name == "local":
                from services.sandbox.backends.local_backend import LocalBackend

                local = LocalBackend(cgroup_parent=settings.cgroup)
                found["local"] = (local, local.task_root)
            elif name == "docker":
                from services.sandbox.backends.docker_backend import DockerBackend

                docker = DockerBackend(settings.docker_host or DEFAULT_DOCKER_HOST)
                found["docker"] = (docker, docker.task_image)
            elif name == "kubernetes":
                from services.sandbox.backends.kubernetes_backend import KubernetesBackend

                kube = KubernetesBackend(kubeconfig=settings.kubeconfig, namespace=settings.k8s_namespace)
                found["kubernetes"] = (kube, kube.task_image)
            else:
                log.warning("unknown sandbox backend %s: skipped", name)
        except SandboxError as e:
            log.warning("sandbox backend %s is not available here: %s", name, e.message)
    return found


async def main(runtime: ServiceRuntime, settings: SandboxSettings) -> None:
    service = SandboxService(runtime, available_backends(settings), settings)
    await service.start()


if __name__ == "__main__":
    run_service(main, "sandbox", SandboxSettings)
