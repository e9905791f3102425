"""The launcher's settings, and its runners': a site's limits (cluster size, evals in flight), where Ray is, and how
the runner starts what it starts. The launcher reads them once when it starts; a runner (a Ray job, ``runctl run``,
verl's workers) reads them from its own environment, which the launcher hands it (``carry/as_job.py``'s
``RUNNER_ENV``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from runctl.settings import ServiceSettings

NODES_TIMEOUT_S = 600.0


class LauncherSettings(ServiceSettings):
    max_evals_in_flight: int = Field(2, ge=1, validation_alias="RUNCTL_MAX_EVALS_IN_FLIGHT")
    """Eval runs of checkpoints in flight at once across the stack; the others wait, queued in step order."""
    cluster_gpus: float = Field(math.inf, ge=0, validation_alias="RUNCTL_CLUSTER_GPUS")
    """GPUs the cluster has, for admission (unset: not limited)."""
    cluster_cpus: float = Field(math.inf, ge=0, validation_alias="RUNCTL_CLUSTER_CPUS")
    """CPUs the cluster has for CPU runs, for admission (unset: not limited)."""
    cluster_sandboxes: float = Field(math.inf, ge=0, validation_alias="RUNCTL_CLUSTER_SANDBOXES")
    """Sandboxes the cluster can hold at once, for admission (unset: not limited)."""
    ray_jobs_url: str | None = Field(None, validation_alias="RUNCTL_RAY_JOBS_URL")
    """The Ray cluster's dashboard (``http://head:8265``) that submitted runs are carried on as Ray jobs; unset: a
    head the launcher starts on its own machine."""
    ray_address: str | None = Field(None, validation_alias="RAY_ADDRESS")
    """The Ray cluster a runner attaches to when its config sets no RAY_ADDRESS (inside a Ray job: its own)."""
    nodes_timeout_s: float = Field(NODES_TIMEOUT_S, gt=0, validation_alias="RUNCTL_NODES_TIMEOUT_SEC")
    """Seconds a runner waits for its run's NNODES Ray nodes to be alive."""
    ray_auth_mode: str | None = Field(None, validation_alias="RAY_AUTH_MODE")
    """Ray's own; when this or another ``RAY_AUTH_*`` is set, a local head keeps it, else it gets a token of its own."""
    ray_auth_token: str | None = Field(None, validation_alias="RAY_AUTH_TOKEN")
    """Ray's own token for a token-authenticated cluster."""
    replica_key: str | None = Field(None, validation_alias="VLLM_API_KEY")
    """In verl's workers: the key verl's vLLM servers require (``runctl.verl.REPLICA_GUARD``), which the runner makes
    for each attempt and hands them through Ray's runtime environment; runctl's proxy there sends it."""
    ray_auth_token_path: str | None = Field(None, validation_alias="RAY_AUTH_TOKEN_PATH")
    """Ray's own: a file holding that token."""
    vllm_cpu_kvcache_space: int = Field(1, ge=1, validation_alias="VLLM_CPU_KVCACHE_SPACE")
    """GiB of KV cache of each CPU vLLM replica a runner starts."""
    run_logins: bool = Field(False, validation_alias="RUNCTL_RUN_LOGINS")
    """Each runner connects with its run's own bus login (``runctl.runlogins``) instead of the launcher's. On where
    something applies the run logins bucket to the bus's configuration: the embedded stack's supervisor does, and
    sets it for its launcher."""
    run_login_seed_file: Path | None = Field(None, validation_alias="RUNCTL_RUN_LOGIN_SEED_FILE")
    """On a bus configured by ``runctl team nats-config --issuer-seed FILE``: that file (the auth callout's account
    seed). The launcher then answers the bus's auth callout for the teams' and the runs' logins (``runctl.callout``);
    needs ``RUNCTL_RUN_LOGINS=1``."""
    bus_system_url: str | None = Field(None, validation_alias="RUNCTL_BUS_SYSTEM_URL")
    """With the seed file: a login to the bus's system account (``nats://system:…@host:4222``, written by
    ``runctl team nats-config`` when ``$RUNCTL_SYSTEM_PASSWORD`` is set). The launcher then closes every connection
    it let in on a login that was revoked, replaced or rotated since; unset, such a connection stays open until its
    client ends it."""
    nats_url: str | None = Field(None, validation_alias="RUNCTL_NATS_URL")
    """The bus a runner (and verl's workers) publish on and book sandboxes through; unset: a foreground run with
    none."""

    @model_validator(mode="after")
    def _callout_needs_run_logins(self) -> Self:
        if self.run_login_seed_file is not None and not self.run_logins:
            raise ValueError(
                "RUNCTL_RUN_LOGIN_SEED_FILE is set, but RUNCTL_RUN_LOGINS is off: the launcher would answer the "
                "bus's auth callout for run logins it never issues. Fix: set RUNCTL_RUN_LOGINS=1, or unset the seed "
                "file."
            )
        return self

    @property
    def ray_auth_set(self) -> bool:
        """Whether the environment chose Ray's authentication already."""
        return any((self.ray_auth_mode, self.ray_auth_token, self.ray_auth_token_path))
