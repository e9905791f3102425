"""Runs as Ray jobs: the launcher submits each ENGINE=local run's runner through the Ray Jobs API and watches it.

The jobs server is ``RUNCTL_RAY_JOBS_URL`` (a cluster's dashboard, ``http://head:8265``); unset, the launcher
starts a Ray head of its own on 127.0.0.1 the first time it needs one (``ray start --head --block`` in its own
process group, recorded among the stack's owned groups, ``$RUNCTL_HOME/owned/ray-head.json``, so that a restarted
launcher reuses it and ``runctl down`` stops it whatever became of the launcher) and stops it when it stops. That
head demands a token of its own (``RAY_AUTH_MODE=token``; Ray's ``ray start`` leaves a head open unless told), kept
in the record (mode 0600): its Jobs API runs any command, and anything that shares the runners' network could
otherwise reach it. A
job's submission id is ``<run_id>.attempt<n>``; its metadata names the run and the team. The runner runs on the
run's VENV_PATH when it sets one (runctl must be installed there), else on the launcher's own Python.

Blocking (the Jobs SDK is synchronous): call these from a thread.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runctl.home import disown_group, home, is_same_process, own_group, owned_groups, stop_group
from runctl.ports import free_ports
from services.launcher.errors import LauncherError
from services.launcher.rollout.cluster import LOCAL_HEAD_ENV
from services.launcher.settings import LauncherSettings

JOBS_URL_ENV = LauncherSettings.env_name("ray_jobs_url")
HEAD_NAME = "ray-head"
"""The head's record among the stack's owned groups (``$RUNCTL_HOME/owned/ray-head.json``)."""
HEAD_START_TIMEOUT_S = 120.0
HEAD_STOP_GRACE_S = 5.0
#: How long a submission waits for the jobs server's dashboard agent, which registers after the jobs API answers:
#: seconds on an idle head; on a loaded machine a CI run's first submission was refused for want of one.
AGENT_WAIT_S = 120.0
AGENT_RETRY_S = 2.0
#: What the jobs server answers while it has no dashboard agent to hand a job to (Ray asks to try again later).
NO_AGENT = "No available agent to submit job"
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


@dataclass
class LocalHead:
    url: str
    pid: int
    temp_dir: str
    token: str = ""
    """What its dashboard and GCS demand (empty only where the site set ``RAY_AUTH_MODE=disabled``)."""

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def head_auth() -> tuple[str, dict[str, str]]:
    """The token a local jobs head demands and the environment that makes it demand it: the site's own
    ``RAY_AUTH_TOKEN`` when it set one, else a new random one; none where the site disabled Ray's authentication."""
    settings = LauncherSettings.from_env()
    if (settings.ray_auth_mode or "").lower() == "disabled":
        return "", {}
    token = settings.ray_auth_token or secrets.token_hex(32)
    return token, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


class RayJobs:
    def __init__(self, url: str | None = None) -> None:
        self.url = url or LauncherSettings.from_env().ray_jobs_url
        self.head: LocalHead | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: Any = None
        # The launcher asks from several threads at once (a train run and its base model's eval run are submitted
        # together): one of them starts the head, the others wait for it, or a second head would be started and
        # left behind.
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------------------- the server
    def client(self) -> Any:
        """The Jobs SDK client, starting (or finding) the local head first when no URL is configured."""
        with self._lock:
            return self._connect()

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        from ray.job_submission import JobSubmissionClient

        if self.url is None:
            self.head = self._reuse_head() or self._start_head()
            self.url = self.head.url
        deadline = time.monotonic() + HEAD_START_TIMEOUT_S
        headers = self.head.headers() if self.head is not None else {}
        while True:
            try:
                self._client = JobSubmissionClient(self.url, headers=headers or None)
                return self._client
            except Exception as e:  # ConnectionError, RuntimeError while the dashboard starts
                if time.monotonic() > deadline:
                    raise LauncherError(
                        f"the Ray jobs server at {self.url} does not answer ({type(e).__name__}: {e}). Fix: check "
                        f"the Ray head, or set {JOBS_URL_ENV} to its dashboard URL (http://head:8265)."
                    ) from e
                if self._proc is not None and self._proc.poll() is not None:
                    raise LauncherError(f"the local Ray head exited with {self._proc.returncode}") from e
                time.sleep(0.5)

    def _reuse_head(self) -> LocalHead | None:
        """The head a previous launcher of this stack started, if it still runs (this launcher then owns it)."""
        for group in owned_groups():
            if group.name == HEAD_NAME and is_same_process(group.record):
                return LocalHead(group.extra["url"], group.pid, group.extra["temp_dir"], group.extra.get("token", ""))
        return None

    def _start_head(self) -> LocalHead:
        temp = tempfile.mkdtemp(prefix="rj-", dir="/tmp")  # short: Ray's socket paths have a length limit
        port, dashboard, client, agent = free_ports(4)
        ray = str(Path(sys.executable).parent / "ray")
        argv = [ray, "start", "--head", "--block", "--disable-usage-stats", f"--port={port}", f"--temp-dir={temp}"]
        argv += ["--node-ip-address=127.0.0.1", "--include-dashboard=true", "--dashboard-host=127.0.0.1"]
        argv += [f"--dashboard-port={dashboard}"]
        # Ray's listeners with a fixed default port (the dashboard agent's 52365, which the Jobs API hands each job
        # to, and the client server's 10001): another Ray on the machine (a foreground run's own cluster) holds them,
        # and the jobs server then hands the runner to that Ray's agent or to none.
        argv += [f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}"]
        log_dir = home() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        token, auth_env = head_auth()
        with (log_dir / "ray-head.log").open("ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **LOCAL_HEAD_ENV, **auth_env},
                start_new_session=True,
            )
        head = LocalHead(f"http://127.0.0.1:{dashboard}", self._proc.pid, temp, token)
        # Recorded with the stack: a restarted launcher reuses it, and `runctl down` stops it even if no launcher can.
        own_group(HEAD_NAME, head.pid, {"url": head.url, "temp_dir": temp, "token": token})
        return head

    def close(self) -> None:
        """Stop the local head this launcher started or took over from a dead one (its whole process group; SIGKILL
        after a short grace, since Ray's own shutdown takes tens of seconds); a configured server is left alone.
        Jobs still running on it end with it: their runs stay active in the ledger, and a restarted launcher submits
        them again."""
        if self.head is None:
            return
        stop_group(self.head.pid, HEAD_STOP_GRACE_S)
        if self._proc is not None:
            self._proc.wait()
            self._proc = None
        disown_group(HEAD_NAME)
        shutil.rmtree(self.head.temp_dir, ignore_errors=True)
        self.head = None

    # ---------------------------------------------------------------------------------------------- the jobs
    def submit(self, team: str, run_id: str, attempt: int, env: dict[str, str], venv: str | None = None) -> str:
        """Submit the runner of ``run_id`` as a Ray job (on ``venv``'s Python when given); its submission id."""
        submission_id = f"{run_id}.attempt{attempt}"
        # From the launcher's folder, so relative paths in a config mean what they meant to the validator.
        interpreter = str(Path(venv) / "bin" / "python") if venv else sys.executable
        here, python = shlex.quote(os.getcwd()), shlex.quote(interpreter)
        entrypoint = f"cd {here} && exec {python} -m services.launcher.carry.job_main {team} {run_id}"
        try:
            self.submit_entrypoint(
                entrypoint,
                submission_id,
                runtime_env={"env_vars": env},
                metadata={"runctl_run": run_id, "runctl_team": team},
            )
        except Exception as e:  # the SDK raises RuntimeError with the server's answer
            waited = f" (for {AGENT_WAIT_S:.0f} s)" if NO_AGENT in str(e) else ""
            where = f"the local head's log, {home() / 'logs' / 'ray-head.log'}" if self.head else "its head's logs"
            raise LauncherError(
                f"the Ray jobs server at {self.url} refused the runner of {run_id}{waited}: {e}. Fix: resubmit the "
                f"run once the jobs server's dashboard agent answers (see {where}; the agent's own log, "
                "dashboard_agent.log, is in the head's session folder).",
                run_id=run_id,
                team=team,
            ) from e
        return submission_id

    def submit_entrypoint(self, entrypoint: str, submission_id: str, **options: Any) -> str:
        """Submit one job as Ray's SDK does, waiting up to ``AGENT_WAIT_S`` for the head's dashboard agent."""
        client = self.client()
        deadline = time.monotonic() + AGENT_WAIT_S
        while True:
            try:
                return str(client.submit_job(entrypoint=entrypoint, submission_id=submission_id, **options))
            except RuntimeError as e:
                # No agent yet (it registers after the jobs API answers): Ray's own words are "try again later".
                if NO_AGENT in str(e) and time.monotonic() < deadline:
                    time.sleep(AGENT_RETRY_S)
                    continue
                raise

    def find(self, run_id: str) -> list[tuple[str, str]]:
        """(submission id, status) of every job of the run, oldest first."""
        found = []
        client = self.client()
        try:
            jobs = client.list_jobs()
        except Exception as e:
            raise LauncherError(f"the Ray jobs server at {self.url} cannot list jobs: {e}", run_id=run_id) from e
        for job in jobs:
            if (job.metadata or {}).get("runctl_run") == run_id and job.submission_id:
                found.append((job.start_time or 0, job.submission_id, _name(job.status)))
        return [(sid, status) for _, sid, status in sorted(found)]

    def status(self, submission_id: str) -> str:
        return _name(self.client().get_job_status(submission_id))

    def stop(self, submission_id: str) -> None:
        self.client().stop_job(submission_id)

    def log_tail(self, submission_id: str, lines: int = 40) -> str:
        try:
            text = str(self.client().get_job_logs(submission_id))
        except Exception as e:
            return f"(no job log: {e})"
        return "\n".join(text.splitlines()[-lines:])


def _name(status: Any) -> str:
    """A JobStatus as its plain name (``SUCCEEDED``)."""
    return str(getattr(status, "value", status))
