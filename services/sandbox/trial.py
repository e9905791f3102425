"""One trial, as Harbor defines it: set up the sandbox, let the agent work, then verify.

Verification is where a trial is made trustworthy:

1. everything the agent left running is killed (a background process cannot re-plant a reward);
2. ``/logs/verifier`` is emptied, so a ``reward.txt`` or ``reward.json`` the agent planted is gone;
3. ``tests/`` is uploaded only now (the agent never saw it) and ``tests/test.sh`` runs with its own timeout;
4. ``reward.json`` (a flat object of numbers) or else ``reward.txt`` (one number) is read; a missing, empty or
   non-numeric reward is a verifier error, never a zero.

An agent that times out is still verified: the reward counts. ``/logs`` is copied into the trial folder and
the sandbox is destroyed whatever happened.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from runctl.tasks import Task
from services.sandbox.agents import Agent, AgentOutcome
from services.sandbox.backends.base import Backend, NetworkMode, Sandbox, SandboxError, SandboxSpec
from services.sandbox.backends.execio import run_script
from services.sandbox.collect import Collected, collect_artifacts, drop_links, read_plain, restore_artifacts, run_hooks

FailureCause = Literal["sandbox", "model", "agent", "agent_budget", "verifier", "cancelled"]
TerminationReason = Literal["agent_completed", "timeout", "overlong", "max_turns", "env_setup_failed", "error"]
VERIFIER_OUTPUT = "/logs/verifier/test-stdout.txt"
#: How long stopping the agent may take. A fork bomb that holds every pid of a Docker sandbox lets a new exec in
#: only when one of its processes exits; on a loaded 2-core host (CI) 30 s was once not enough.
STOP_AGENT_PATIENCE_S = 60.0
#: Stops the agent for good before verifying: every process but PID 1 (the init), the sandbox's idle loop (the
#: child of PID 1 that started first: a fork bomb may have wrapped the pid numbers) and this shell is sent SIGSTOP,
#: sweep after sweep until a sweep finds none running (a fork bomb cannot outrun it: stopped processes do not fork),
#: then SIGKILL until none runs. Shell builtins only: it must work when no process can be forked. Then
#: /logs/verifier is emptied, so no planted reward survives. A killed process holds its pid until the init reaps it,
#: so the runner then waits, from outside and spending none of the sandbox's CPU, until a process can start again.
STOP_AGENT = r"""
idle=""; born=""
for f in /proc/[0-9]*/stat; do
  { read -r s < "$f"; } 2>/dev/null || continue
  rest=${s##*) }; set -- $rest; p=${f#/proc/}; p=${p%/stat}
  if [ "$2" = 1 ] && { [ -z "$born" ] || [ "${20}" -lt "$born" ]; }; then
    idle=$p; born=${20}
  fi
done
sweep() {
  action=$1; n=0
  for f in /proc/[0-9]*/stat; do
    { read -r s < "$f"; } 2>/dev/null || continue
    p=${f#/proc/}; p=${p%/stat}
    [ "$p" = 1 ] || [ "$p" = "$idle" ] || [ "$p" = "$$" ] || {
      rest=${s##*) }; set -- $rest
      if [ "$action" = KILL ]; then
        [ "$1" = Z ] || { kill -9 "$p" 2>/dev/null; n=$((n + 1)); }
      elif [ "$1" != T ] && [ "$1" != Z ]; then kill -STOP "$p" 2>/dev/null; n=$((n + 1)); fi
    }
  done
}
i=0
while [ $i -lt 100 ]; do sweep STOP; [ $n = 0 ] && break; i=$((i + 1)); done
i=0
while [ $i -lt 100 ]; do sweep KILL; [ $n = 0 ] && break; i=$((i + 1)); done
[ $n = 0 ] || { echo "$n processes still run after SIGKILL" >&2; exit 1; }
rm -rf /logs/verifier && mkdir -p /logs/verifier && chmod 777 /logs/verifier
"""


#: True once the killed processes are reaped: a handful of processes left (the init, the idle loop, this shell), so
#: the verifier will be able to fork. Builtins only (a glob, not ls): it must run while pids are scarce.
REAPED = 'set -- /proc/[0-9]*; [ "$#" -le 16 ]'


class Failure(BaseModel):
    cause: FailureCause
    message: str


class TrialResult(BaseModel):
    """What a trial produced; written to ``result.json`` in the trial folder."""

    task_id: str
    trial_id: str
    agent: str
    backend: str
    reward: float | None = None
    rewards: dict[str, float] = Field(default_factory=dict)
    reward_valid: bool = False
    termination_reason: TerminationReason = "error"
    failure: Failure | None = None
    timings_s: dict[str, float] = Field(default_factory=dict)
    verifier_exit_code: int | None = None
    notes: list[str] = Field(default_factory=list)
    """What went wrong without failing the trial: a collect hook that failed, an artifact not there, a dropped link."""


class RewardError(ValueError):
    """The verifier left no usable reward."""


def parse_reward(json_text: str | None, txt_text: str | None) -> tuple[float, dict[str, float]]:
    """(reward, all rewards) from ``reward.json`` or else ``reward.txt``.

    Raises:
        RewardError: neither file holds a finite number (missing, empty, NaN, not a number, not flat).
    """
    if json_text is not None:
        try:
            doc = json.loads(json_text)
        except ValueError as e:
            raise RewardError(f"reward.json is not JSON ({e})") from None
        if not isinstance(doc, dict) or not doc:
            raise RewardError("reward.json is not a non-empty flat object of numbers")
        rewards: dict[str, float] = {}
        for key, value in doc.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise RewardError(f"reward.json: {key} = {value!r} is not a finite number")
            rewards[str(key)] = float(value)
        if "reward" in rewards:
            return rewards["reward"], rewards
        if len(rewards) == 1:
            return next(iter(rewards.values())), rewards
        raise RewardError(f"reward.json has several values ({', '.join(rewards)}) and none is named reward")
    if txt_text is None:
        raise RewardError("the verifier wrote neither reward.json nor reward.txt")
    text = txt_text.strip()
    if not text:
        raise RewardError("reward.txt is empty")
    try:
        value = float(text)
    except ValueError:
        raise RewardError(f"reward.txt holds {text[:40]!r}, not a number") from None
    if not math.isfinite(value):
        raise RewardError(f"reward.txt holds {text}, not a finite number")
    return value, {"reward": value}


@dataclass(frozen=True)
class TrialLimits:
    """What a run's config sets for every trial, over what each task says (None: the task's own)."""

    cpus: float | None = None
    """SANDBOX_CPUS."""
    memory_mb: int | None = None
    """SANDBOX_MEMORY_MB."""
    agent_network: NetworkMode | None = None
    """AGENT_NETWORK: the network of the agent's sandbox (and of a verifier that shares it)."""
    verifier_network: NetworkMode | None = None
    """VERIFIER_NETWORK: the network of a separate verifier's sandbox."""
    trial_timeout_s: float | None = None
    """TRIAL_HARD_TIMEOUT_SEC: setup, agent and verifier together; the agent and the verifier get what is left."""


def sandbox_spec(
    task: Task,
    image: str | None,
    labels: dict[str, str],
    network: str | None = None,
    binds: tuple[tuple[str, str, bool], ...] = (),
    limits: TrialLimits = TrialLimits(),
) -> SandboxSpec:
    env = task.config.environment
    return SandboxSpec(
        sandbox_id=f"{task.id.replace('/', '-')[:40]}-{uuid.uuid4().hex[:8]}".lower(),
        image=image,
        cpus=limits.cpus or env.cpus,
        memory_mb=limits.memory_mb or env.memory_mb,
        storage_mb=env.storage_mb,
        network=network or env.network_mode or "no-network",  # type: ignore[arg-type]
        allowed_hosts=tuple(env.allowed_hosts),
        workdir=env.workdir or "/app",
        env=dict(env.env),
        labels=labels,
        binds=binds,
    )


class _Deadline:
    """The trial's hard deadline (TRIAL_HARD_TIMEOUT_SEC), if it has one: each phase gets at most what is left."""

    def __init__(self, seconds: float | None) -> None:
        self.at = None if seconds is None else time.monotonic() + seconds
        self.seconds = seconds

    def cap(self, timeout_s: float) -> float:
        return timeout_s if self.at is None else max(0.0, min(timeout_s, self.at - time.monotonic()))

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at


class TrialRunner:
    """Runs trials of tasks on one backend; ``image_for`` turns a task into what ``create`` needs."""

    def __init__(
        self, backend: Backend, image_for: Callable[[Task], str | None], limits: TrialLimits = TrialLimits()
    ) -> None:
        self.backend = backend
        self.image_for = image_for
        self.limits = limits

    def run(self, task: Task, agent: Agent, trial_dir: Path, labels: dict[str, str] | None = None) -> TrialResult:
        trial_dir.mkdir(parents=True, exist_ok=True)
        result = TrialResult(task_id=task.id, trial_id=trial_dir.name, agent=agent.name, backend=self.backend.name)
        started = time.monotonic()
        deadline = _Deadline(self.limits.trial_timeout_s)
        sandbox: Sandbox | None = None
        try:
            mark = time.monotonic()
            try:
                binds_for = getattr(agent, "binds_for", None)  # an agent inside the sandbox, on the runner's side
                spec = sandbox_spec(
                    task,
                    self.image_for(task),
                    labels or {},
                    network=self.limits.agent_network,
                    binds=binds_for(self.backend) if binds_for is not None else (),
                    limits=self.limits,
                )
                sandbox = self.backend.create(spec)
                self._healthcheck(task, sandbox)
            except SandboxError as e:
                result.termination_reason = "env_setup_failed"
                result.failure = Failure(cause="sandbox", message=e.message)
                return result
            result.timings_s["environment_setup"] = time.monotonic() - mark
            outcome = self._agent_phase(task, agent, sandbox, result, deadline)
            result.termination_reason = outcome.termination_reason
            if outcome.failure is not None:
                result.failure = Failure(cause=outcome.failure[0], message=outcome.failure[1])
            mark = time.monotonic()
            self._stop_agent(sandbox)
            result.notes += run_hooks(self.backend, sandbox, task)
            collected, notes = collect_artifacts(self.backend, sandbox, task, trial_dir)
            result.notes += notes
            if task.config.verifier.separate:
                self._collect(sandbox, trial_dir, result)
                self.backend.destroy(sandbox)
                sandbox = None
                self._verify_apart(task, trial_dir, result, collected, labels or {}, deadline, mark)
            else:
                if task.config.verifier.collect:
                    self._stop_agent(sandbox)  # whatever a hook left running, and anything it wrote to /logs/verifier
                self._verify(task, sandbox, trial_dir, result, deadline, mark)
        except SandboxError as e:
            result.failure = result.failure or Failure(cause="sandbox", message=e.message)
        finally:
            if sandbox is not None:
                try:
                    self._collect(sandbox, trial_dir, result)
                finally:
                    self.backend.destroy(sandbox)
            result.timings_s["total"] = time.monotonic() - started
            (trial_dir / "result.json").write_text(result.model_dump_json(indent=2))
        return result

    def _healthcheck(self, task: Task, sandbox: Sandbox) -> None:
        """The task's ``[environment.healthcheck]``, as Docker runs one: failures in the start period do not count;
        ``retries`` failures in a row after it mean the environment never became ready.

        Raises:
            SandboxError: it did not pass.
        """
        check = task.config.environment.healthcheck
        if check is None:
            return
        started, failures = time.monotonic(), 0
        while True:
            done = self.backend.exec(sandbox, check.command, check.timeout_sec)
            if done.exit_code == 0 and not done.timed_out:
                return
            starting = time.monotonic() - started < check.start_period_sec
            failures += 0 if starting else 1
            if failures >= check.retries:
                why = "timed out" if done.timed_out else f"exited {done.exit_code}: {done.stderr.strip()[-300:]}"
                raise SandboxError(
                    f"the task's healthcheck `{check.command}` failed {failures} times in a row ({why}): its "
                    "environment never became ready. Fix: check the task's environment and its healthcheck."
                )
            time.sleep(check.start_interval_sec if starting else check.interval_sec)

    def _agent_phase(
        self, task: Task, agent: Agent, sandbox: Sandbox, result: TrialResult, deadline: _Deadline
    ) -> AgentOutcome:
        mark = time.monotonic()
        agent.setup(self.backend, sandbox, task)
        result.timings_s["agent_setup"] = time.monotonic() - mark
        mark = time.monotonic()
        outcome = agent.run(self.backend, sandbox, task, deadline.cap(task.config.agent.timeout_sec))
        result.timings_s["agent_execution"] = time.monotonic() - mark
        if outcome.termination_reason == "timeout" and deadline.passed():
            seconds = deadline.seconds or 0
            return AgentOutcome("timeout", ("agent_budget", f"the trial ran past its hard limit of {seconds:g} s"))
        return outcome

    def _verify(
        self, task: Task, sandbox: Sandbox, trial_dir: Path, result: TrialResult, deadline: _Deadline, mark: float
    ) -> None:
        """Verify in the agent's own sandbox (shared mode): the agent was stopped and /logs/verifier emptied."""
        self.backend.upload(sandbox, task.path / "tests", "/tests")
        self._run_verifier(task, sandbox, trial_dir, result, deadline)
        result.timings_s["verifier"] = time.monotonic() - mark

    def _verify_apart(
        self,
        task: Task,
        trial_dir: Path,
        result: TrialResult,
        collected: list[Collected],
        labels: dict[str, str],
        deadline: _Deadline,
        mark: float,
    ) -> None:
        """Verify in a sandbox of its own (``environment_mode = "separate"``): made from the verifier's environment,
        given the agent's artifacts (``/logs/artifacts`` and the declared ones) at their paths, and the tests."""
        view = task.verifier_view()
        spec = sandbox_spec(
            view,
            self.image_for(view),
            {**labels, "runctl.role": "verifier"},
            network=self.limits.verifier_network,
            limits=self.limits,
        )
        verifier = self.backend.create(spec)
        try:
            agent_artifacts = trial_dir / "logs" / "artifacts"
            if agent_artifacts.is_dir():
                self.backend.upload(verifier, agent_artifacts, "/logs/artifacts")
            restore_artifacts(self.backend, verifier, collected, trial_dir)
            self.backend.upload(verifier, task.path / "tests", "/tests")
            self._run_verifier(task, verifier, trial_dir, result, deadline)
        finally:
            try:
                found = self.backend.download(verifier, "/logs/verifier", trial_dir / "logs" / "verifier")
                if found:
                    result.notes += [f"dropped the link {p}" for p in drop_links(trial_dir / "logs" / "verifier")]
            finally:
                self.backend.destroy(verifier)
            result.timings_s["verifier"] = time.monotonic() - mark

    def _run_verifier(
        self, task: Task, sandbox: Sandbox, trial_dir: Path, result: TrialResult, deadline: _Deadline
    ) -> None:
        verifier = task.config.verifier
        timeout = deadline.cap(verifier.timeout_sec)
        if timeout <= 0:
            result.failure = Failure(
                cause="verifier", message=f"no time was left to verify (TRIAL_HARD_TIMEOUT_SEC={deadline.seconds:g})"
            )
            return
        run = self.backend.exec(
            sandbox,
            f"{run_script('/tests/test.sh')} > {VERIFIER_OUTPUT} 2>&1",
            timeout,
            user=verifier.user,
            env=dict(verifier.env) or None,
        )
        result.verifier_exit_code = run.exit_code
        if run.timed_out:
            result.failure = Failure(cause="verifier", message=f"test.sh ran past {timeout:.0f} s")
            return
        found = trial_dir / "reward"
        texts: dict[str, str | None] = {}
        try:
            for name in ("reward.json", "reward.txt"):
                target = found / name
                texts[name] = (
                    read_plain(target) if self.backend.download(sandbox, f"/logs/verifier/{name}", target) else None
                )
            result.reward, result.rewards = parse_reward(texts["reward.json"], texts["reward.txt"])
            result.reward_valid = True
        except RewardError as e:
            result.failure = Failure(cause="verifier", message=str(e))
        except SandboxError as e:
            drop_links(found)
            result.failure = Failure(cause="verifier", message=f"the verifier left no usable reward: {e.message}")

    def _stop_agent(self, sandbox: Sandbox) -> None:
        """Stop the agent for good: the backend's ``halt_agent`` where it has one (Docker with a local daemon: freeze,
        kill, thaw), then STOP_AGENT until it succeeds (it finds nothing left after a halt; without one, while a
        fork bomb holds every pid of the sandbox, starting even one process in it fails now and then, until the
        sweep has stopped the bomb), then wait until the killed processes are reaped."""
        deadline = time.monotonic() + STOP_AGENT_PATIENCE_S
        halt = getattr(self.backend, "halt_agent", None)
        if halt is not None:
            halt(sandbox)  # a backend that can freeze the sandbox from outside kills the agent first, race-free
        stopped = False
        while True:
            try:
                if not stopped:
                    result = self.backend.exec(sandbox, STOP_AGENT, 30, user="0")
                    stopped = result.exit_code == 0
                    problem = result.stderr.strip() or f"exit code {result.exit_code}"
                if stopped:
                    if self.backend.exec(sandbox, REAPED, 10, user="0").exit_code == 0:
                        return
                    problem = "the killed processes still hold their pids (the init has not reaped them yet)"
            except SandboxError as e:
                problem = e.message
            if time.monotonic() > deadline:
                raise SandboxError(f"could not stop the agent's processes before verifying: {problem}")
            time.sleep(0.2)

    def _collect(self, sandbox: Sandbox, trial_dir: Path, result: TrialResult) -> None:
        """Copy the sandbox's ``/logs`` into the trial folder, dropping every link in it."""
        try:
            found = self.backend.download(sandbox, "/logs", trial_dir / "logs")
        except SandboxError:
            return  # the sandbox died: the result already says why
        if found:
            result.notes += [f"dropped the link {p}" for p in drop_links(trial_dir / "logs")]
