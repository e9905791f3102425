"""The validator's settings: what its probes of the machine and the cluster read of the environment they run in
(``runctl validate``, ``runctl run``, a runner before it launches). Read when a probe first asks (static checks never
do: ``runctl validate --static`` does not pay for them)."""

from __future__ import annotations

from pydantic import Field

from runctl.settings import ServiceSettings


class ValidatorSettings(ServiceSettings):
    ray_address: str | None = Field(None, validation_alias="RAY_ADDRESS")
    """The Ray cluster this process is inside (a runner in a Ray job): a run without its own RAY_ADDRESS attaches to
    it, so the local head's ports and GPUs are not probed."""
    ray_auth_token: str | None = Field(None, validation_alias="RAY_AUTH_TOKEN")
    """The token a token-authenticated Ray cluster's dashboard wants; the cluster probe sends it."""
    check_timeout_s: float = Field(60.0, gt=0, validation_alias="RUNCTL_CHECK_TIMEOUT_S")
    """Seconds one check of a submission may take in the validator service (default 60); past it, that check is
    fatal for the submission and the others still run."""
