"""The sandbox service's settings (``RUNCTL_SANDBOX_*``, and the Docker and Kubernetes variables its clients read).

The service reads them once at start-up; a run's runner reads the same ones where it books sandboxes (the team's cap,
the scope), so a team's cap holds across the service's sandboxes and every run's.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from runctl.settings import NoDecode, ServiceSettings, comma_list

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


class SandboxSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="RUNCTL_SANDBOX_")

    backends: Annotated[list[str], NoDecode] = ["local", "docker"]
    """The backends the service serves, comma-separated (``local``, ``docker``, ``kubernetes``); one that cannot
    start here is skipped with a warning in the service's log."""
    caps: Annotated[dict[str, int], NoDecode] = {}
    """Sandboxes each team may hold at once, ``team=N,…``, across the service and every run's runner."""
    default_cap: int = Field(64, ge=0)
    """Sandboxes a team not named in ``RUNCTL_SANDBOX_CAPS`` may hold at once."""
    scope: str = "default"
    """The label that tells this deployment's sandboxes from another's on a shared Docker daemon or cluster: the
    reaper touches only its own scope's."""
    cgroup: str = "runctl"
    """The parent cgroup folder (under the cgroup v2 root) of local sandboxes."""
    warm: int = Field(0, ge=0)
    """Sandboxes kept ready per kind of sandbox, once that kind has been asked for (0: none)."""
    k8s_namespace: str = Field("runctl", validation_alias="K8S_NAMESPACE")
    """The Kubernetes namespace of the kubernetes backend's pods."""
    docker_host: str | None = Field(None, validation_alias="DOCKER_HOST")
    """The Docker daemon of the docker backend (unset: ``unix:///var/run/docker.sock``)."""
    kubeconfig: str | None = Field(None, validation_alias="KUBECONFIG")
    """The kubeconfig of the kubernetes backend (unset: the pod's in-cluster credentials)."""

    @field_validator("backends", mode="before")
    @classmethod
    def _backends(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("caps", mode="before")
    @classmethod
    def _caps(cls, value: Any) -> Any:
        """``nlp=8,vision=4`` → caps per team."""
        if not isinstance(value, str):
            return value
        caps: dict[str, str] = {}
        for item in comma_list(value):
            team, equals, cap = item.partition("=")
            if not equals or not team.strip():
                raise ValueError(f"{item!r} is not team=N")
            caps[team.strip()] = cap.strip()
        return caps

    def cap_of(self, team: str) -> int:
        return self.caps.get(team, self.default_cap)


def docker_host(configured: str | None = None) -> str:
    """The Docker daemon a run uses: its DOCKER_HOST key, else ``$DOCKER_HOST``, else the local socket. The
    validator's probe and the runner both ask this, so they talk to the same daemon."""
    return configured or SandboxSettings.from_env().docker_host or DEFAULT_DOCKER_HOST


def kubeconfig_path(configured: str | None = None) -> str | None:
    """The kubeconfig a run uses: its KUBECONFIG key, else ``$KUBECONFIG``; None means in-cluster credentials. The
    validator's probe and the runner both ask this."""
    return configured or SandboxSettings.from_env().kubeconfig
