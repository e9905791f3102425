"""The Ray head the launcher starts for its runners' jobs demands its token: its Jobs API runs any command as the
launcher's user and lists every job's environment, and anything that shares the runners' network namespace can reach
its port. Attacked over HTTP with no token and a wrong one; the launcher's own client (the control) gets in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.launcher.carry.rayjob import HEAD_NAME, RayJobs
from tests.infra import ray_head as ray_infra

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(ray_infra.why_unavailable()), reason=str(ray_infra.why_unavailable())),
]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayJobs]:
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RUNCTL_HOME", str(home))
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RUNCTL_RAY_JOBS_URL"):
            patch.delenv(name, raising=False)
        started = RayJobs()
        try:
            started.client()  # starts the head and waits for its jobs server
            yield started
        finally:
            started.close()


SUBMIT = {"entrypoint": "touch /tmp/runctl-ray-attack", "submission_id": "attack"}


@pytest.mark.parametrize("token", [None, "wrong-token"])
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/api/jobs/", None), ("POST", "/api/jobs/", SUBMIT), ("GET", "/api/v0/nodes", None)],
)
def test_the_launchers_jobs_head_refuses_a_caller_without_its_token(
    jobs: RayJobs, token: str | None, method: str, path: str, body: dict[str, str] | None
) -> None:
    assert jobs.head is not None and jobs.head.token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = httpx.request(method, jobs.head.url + path, headers=headers, json=body, timeout=10)
    assert answer.status_code in (401, 403), (answer.status_code, answer.text[:300])
    assert not Path("/tmp/runctl-ray-attack").exists()
    # The control: the launcher's own client lists the jobs (none was submitted).
    assert jobs.client().list_jobs() == []


def test_the_token_is_kept_only_in_the_launchers_private_record(jobs: RayJobs) -> None:
    from runctl.home import home

    record = home() / "owned" / f"{HEAD_NAME}.json"
    assert json.loads(record.read_text())["extra"]["token"] == jobs.head.token  # type: ignore[union-attr]
    assert (home() / "owned").stat().st_mode & 0o777 == 0o700
