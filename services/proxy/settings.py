"""The proxy's settings when it runs as a service (``python -m services.proxy``) or on its own (``runctl proxy
serve``, which takes the admin token from here and the rest from its options)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from runctl.settings import NoDecode, ServiceSettings, comma_list


class ProxySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="RUNCTL_PROXY_")

    upstreams: Annotated[list[str], NoDecode] = []
    """The vLLM replicas it routes to, comma-separated ``http://HOST:PORT``."""
    discover_ray: bool = False
    """``1``: also route to the ``vllm_server_*`` actors of the Ray cluster at ``RAY_ADDRESS``."""
    ray_address: str | None = Field(None, validation_alias="RAY_ADDRESS")
    """The Ray cluster whose replicas ``RUNCTL_PROXY_DISCOVER_RAY`` finds."""
    host: str = "127.0.0.1"
    """The address it listens on."""
    port: int = Field(0, ge=0, le=65535)
    """The port it listens on (0: a free one; the service writes its URL to ``$RUNCTL_HOME/proxy.json``)."""
    trajectory_dir: Path | None = None
    """Where each closed session's trajectory is written (unset: ``$RUNCTL_HOME/trajectories``)."""
    upstream_key: str | None = None
    """The bearer key the replicas require (vLLM's ``VLLM_API_KEY``, or a run's replica key), sent with every request
    to them; unset: none is sent."""
    admin_token: str | None = None
    """The token of the admin API (sessions, replicas); unset: one is generated and written beside the URL (mode
    0600), or printed by ``runctl proxy serve``."""

    @field_validator("upstreams", mode="before")
    @classmethod
    def _upstreams(cls, value: Any) -> Any:
        return comma_list(value)


ADMIN_TOKEN_ENV = ProxySettings.env_name("admin_token")
UPSTREAM_KEY_ENV = ProxySettings.env_name("upstream_key")
